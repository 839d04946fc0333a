package deploytest

import (
	"archive/tar"
	"bytes"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// How podman runs containers here. Each choice is what works on a
// machine where the tests themselves run in a container, and works on an
// ordinary one too:
//   - a storage of the test's own (vfs: no overlay mounts to clean up);
//   - runc: crun refuses a hybrid cgroup hierarchy (cgroup v1 controllers
//     beside a v2 mount: "cgroups in hybrid mode not supported");
//   - --cgroup-manager cgroupfs: no systemd to ask;
//   - --network host: the container reaches the upstream on 127.0.0.1 and
//     the test reaches the proxy there, without a network set-up;
//   - the open-files and process limits given, no higher than the test's
//     own: podman's defaults (1048576 open files) need CAP_SYS_RESOURCE to
//     set above the hard limit, which a container running the tests may
//     not have ("setrlimit RLIMIT_NOFILE: operation not permitted");
//   - the k8s-file log driver: the default, journald, may have no
//     journal to write to, and podman logs then prints nothing.
type podman struct {
	t       *testing.T
	storage []string
}

func newPodman(t *testing.T) *podman {
	t.Helper()
	for _, tool := range []string{"buildah", "podman", "runc"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is not installed: sudo apt-get install -y buildah podman runc (make image-test says so too)", tool)
		}
	}
	dir := t.TempDir()
	p := &podman{t: t, storage: []string{"--root", filepath.Join(dir, "root"), "--runroot", filepath.Join(dir, "run"), "--storage-driver", "vfs"}}
	t.Cleanup(func() {
		// What podman made in the storage, before t.TempDir removes it.
		_, _ = p.run("rm", "--all", "--force", "--volumes")
		_, _ = p.run("rmi", "--all", "--force")
		_, _ = p.run("volume", "rm", "--all", "--force")
	})
	return p
}

// run runs podman with args and returns its stdout; err holds its stderr.
func (p *podman) run(args ...string) (string, error) {
	full := append(append(slices.Clone(p.storage), "--cgroup-manager", "cgroupfs", "--runtime", "runc"), args...)
	cmd := exec.Command("podman", full...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("podman %s: %v: %s", strings.Join(args, " "), err, stderr.String())
	}
	return stdout.String(), nil
}

// logs returns what the container wrote, stdout and stderr (podman logs
// writes each to its own).
func (p *podman) logs(name string) string {
	full := append(slices.Clone(p.storage), "logs", name)
	out, err := exec.Command("podman", full...).CombinedOutput()
	if err != nil {
		return fmt.Sprintf("podman logs: %v: %s", err, out)
	}
	return string(out)
}

func (p *podman) must(args ...string) string {
	p.t.Helper()
	out, err := p.run(args...)
	if err != nil {
		p.t.Fatal(err)
	}
	return out
}

// runFlags are the flags of every podman run (see podman).
func runFlags(t *testing.T) []string {
	t.Helper()
	var nofile syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &nofile); err != nil {
		t.Fatal(err)
	}
	n := min(nofile.Max, 65536)
	return []string{"--network", "host", "--log-driver", "k8s-file", "--ulimit", fmt.Sprintf("nofile=%d:%d", n, n), "--ulimit", "nproc=4096:4096"}
}

// buildImage builds the image as make image does (deploy/image/build.sh)
// into the podman's storage and returns its name.
func buildImage(t *testing.T, p *podman) string {
	t.Helper()
	bin := tool(t, "IDEM_IMAGE_BIN", "image-test")
	name := "localhost/idem-test:" + strings.ToLower(rand.Text()[:10])
	cmd := exec.Command("bash", filepath.Join(repoRoot, "deploy", "image", "build.sh"))
	cmd.Env = append(os.Environ(), "IDEM_BIN="+bin, "IMAGE="+name, "IMAGE_TOOL=buildah",
		"IMAGE_TOOL_FLAGS="+strings.Join(p.storage, " "),
		"VERSION="+os.Getenv("IDEM_IMAGE_VERSION"), "COMMIT="+os.Getenv("IDEM_IMAGE_COMMIT"), "DATE=2026-01-02T03:04:05Z")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("deploy/image/build.sh: %v\n%s", err, out)
	}
	return name
}

// TestImage builds the image and checks its configuration, its files, and
// the proxy running in it.
func TestImage(t *testing.T) {
	p := newPodman(t)
	image := buildImage(t, p)
	version, commit := os.Getenv("IDEM_IMAGE_VERSION"), os.Getenv("IDEM_IMAGE_COMMIT")

	t.Run("config", func(t *testing.T) {
		var inspected []struct {
			Config struct {
				User       string
				Entrypoint []string
				Cmd        []string
				Env        []string
				WorkingDir string
				Volumes    map[string]struct{}
				Labels     map[string]string
			}
		}
		if err := json.Unmarshal([]byte(p.must("image", "inspect", image)), &inspected); err != nil || len(inspected) != 1 {
			t.Fatalf("podman image inspect: %v", err)
		}
		c := inspected[0].Config
		if c.User != "65532:65532" {
			t.Errorf("user: got %q, want 65532:65532", c.User)
		}
		if !slices.Equal(c.Entrypoint, []string{"/idem"}) || !slices.Equal(c.Cmd, []string{"proxy"}) {
			t.Errorf("entrypoint, cmd: got %q %q, want [/idem] [proxy]", c.Entrypoint, c.Cmd)
		}
		if _, ok := c.Volumes["/data"]; !ok {
			t.Errorf("volumes: got %v, want /data", c.Volumes)
		}
		for _, e := range []string{"IDEM_DATA=/data", "IDEM_LISTEN=0.0.0.0:8080", "IDEM_ADMIN_LISTEN=0.0.0.0:9090"} {
			if !slices.Contains(c.Env, e) {
				t.Errorf("env: got %q, want %s", c.Env, e)
			}
		}
		for k, want := range map[string]string{
			"org.opencontainers.image.version":  version,
			"org.opencontainers.image.revision": commit,
			"org.opencontainers.image.created":  "2026-01-02T03:04:05Z",
			"org.opencontainers.image.source":   "https://github.com/idemgo/idem",
			"org.opencontainers.image.licenses": "Apache-2.0",
			"org.opencontainers.image.title":    "idem",
		} {
			if c.Labels[k] != want {
				t.Errorf("label %s: got %q, want %q", k, c.Labels[k], want)
			}
		}
	})

	t.Run("files", func(t *testing.T) {
		// Everything the image holds: the binary, the certificates, the
		// user's names, /data for the user; no shell, nothing else.
		ctr := strings.TrimSpace(p.must("create", image))
		defer p.run("rm", "-f", ctr)
		tarball := p.must("export", ctr)
		type entry struct {
			mode     int64
			uid, gid int
			dir      bool
		}
		got := map[string]entry{}
		tr := tar.NewReader(strings.NewReader(tarball))
		for {
			h, err := tr.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatalf("podman export: %v", err)
			}
			name := "/" + strings.TrimSuffix(strings.TrimPrefix(h.Name, "./"), "/")
			got[name] = entry{h.Mode & 0o7777, h.Uid, h.Gid, h.Typeflag == tar.TypeDir}
		}
		want := map[string]entry{
			"/idem":                              {0o555, 0, 0, false},
			"/etc/ssl/certs/ca-certificates.crt": {0o444, 0, 0, false},
			"/etc/passwd":                        {0o444, 0, 0, false},
			"/etc/group":                         {0o444, 0, 0, false},
			"/data":                              {0o755, 65532, 65532, true},
		}
		for name, w := range want {
			g, ok := got[name]
			if !ok {
				t.Errorf("%s: missing", name)
				continue
			}
			if g != w {
				t.Errorf("%s: got mode %o uid %d gid %d dir %v, want %o %d %d %v", name, g.mode, g.uid, g.gid, g.dir, w.mode, w.uid, w.gid, w.dir)
			}
		}
		for name, e := range got {
			if _, ok := want[name]; !ok && !e.dir {
				t.Errorf("unexpected file %s in the image", name)
			}
		}
		if _, ok := got["/bin/sh"]; ok {
			t.Error("the image has a shell")
		}
	})

	t.Run("version", func(t *testing.T) {
		out := p.must(append(append([]string{"run", "--rm"}, runFlags(t)...), image, "version", "--json")...)
		var v struct {
			Version, Commit, Platform string
		}
		if err := json.Unmarshal([]byte(out), &v); err != nil {
			t.Fatalf("idem version --json: %v in %q", err, out)
		}
		if v.Version != version || v.Commit != commit || !strings.HasPrefix(v.Platform, "linux/") {
			t.Errorf("idem version --json: got %+v, want version %q, commit %q, linux", v, version, commit)
		}
	})

	t.Run("proxy", func(t *testing.T) {
		var executions atomic.Int64
		upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			n := executions.Add(1)
			w.WriteHeader(http.StatusCreated)
			fmt.Fprintf(w, "execution %d", n)
		}))
		t.Cleanup(upstream.Close)
		listen, admin := freeAddr(t), freeAddr(t)
		name := "idem-test-" + strings.ToLower(rand.Text()[:10])
		args := append([]string{"run", "-d", "--name", name, "--read-only"}, runFlags(t)...)
		args = append(args, image, "proxy", "--listen", listen, "--admin-listen", admin, "--upstream", upstream.URL)
		p.must(args...)
		t.Cleanup(func() {
			if t.Failed() {
				t.Logf("container log:\n%s", p.logs(name))
			}
			_, _ = p.run("rm", "-f", "-v", name)
		})
		waitHTTP(t, "http://"+admin+"/readyz", 200)

		post := func() (int, string, string) {
			req, _ := http.NewRequest("POST", "http://"+listen+"/payments", strings.NewReader(`{"amount":100}`))
			req.Header.Set("Idempotency-Key", "image-test-1")
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer res.Body.Close()
			body, _ := io.ReadAll(res.Body)
			return res.StatusCode, res.Header.Get("Idempotent-Replayed"), string(body)
		}
		if status, replayed, body := post(); status != 201 || replayed != "" || body != "execution 1" {
			t.Errorf("first request: got %d %q %q, want 201, not replayed, execution 1", status, replayed, body)
		}
		if status, replayed, body := post(); status != 201 || replayed != "true" || body != "execution 1" {
			t.Errorf("retry: got %d %q %q, want 201 replayed, execution 1", status, replayed, body)
		}
		if n := executions.Load(); n != 1 {
			t.Errorf("upstream executions: got %d, want 1", n)
		}

		// The process runs as 65532, and the store it wrote is in the
		// volume, the user's.
		pid := strings.TrimSpace(p.must("inspect", "--format", "{{.State.Pid}}", name))
		status, err := os.ReadFile("/proc/" + pid + "/status")
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range strings.Split(string(status), "\n") {
			if strings.HasPrefix(l, "Uid:") || strings.HasPrefix(l, "Gid:") {
				if f := strings.Fields(l); len(f) != 5 || f[1] != "65532" || f[2] != "65532" || f[3] != "65532" || f[4] != "65532" {
					t.Errorf("the proxy's %s got %q, want 65532 everywhere", f[0], l)
				}
			}
		}
		var st syscall.Stat_t
		if err := syscall.Stat("/proc/"+pid+"/root/data/idem.db", &st); err != nil {
			t.Errorf("the embedded store in the volume: %v", err)
		} else if st.Uid != 65532 {
			t.Errorf("/data/idem.db: got uid %d, want 65532", st.Uid)
		}

		// SIGTERM: the proxy stops cleanly.
		p.must("stop", "--time", "20", name)
		code := strings.TrimSpace(p.must("inspect", "--format", "{{.State.ExitCode}}", name))
		if code != "0" {
			t.Errorf("exit code after SIGTERM: got %s, want 0", code)
		}
		if logs := p.logs(name); !strings.Contains(logs, "idem proxy stopped") {
			t.Errorf("log: got %q, want the stop line", logs)
		}
	})

	t.Run("read-only root", func(t *testing.T) {
		// The control: on the read-only root filesystem the store cannot
		// be anywhere but the volume.
		args := append([]string{"run", "--rm", "--read-only"}, runFlags(t)...)
		args = append(args, image, "proxy", "--listen", freeAddr(t), "--upstream", "http://127.0.0.1:9", "--check-upstream=false", "--data", "/var/idem")
		_, err := p.run(args...)
		if err == nil || !strings.Contains(err.Error(), "read-only file system") {
			t.Errorf("a store outside /data: got %v, want a read-only file system error", err)
		}
	})
}

// freeAddr returns a loopback address whose port is free now.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// waitHTTP waits until url answers status (the container starting).
func waitHTTP(t *testing.T, url string, status int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		res, err := http.Get(url)
		if err == nil {
			res.Body.Close()
			if res.StatusCode == status {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: no %d after 30s (last: %v %v)", url, status, res, err)
		}
		time.Sleep(50 * time.Millisecond) // poll until the container serves
	}
}

// TestImageDockerfile: the Dockerfile's final stage, for Docker users, is
// the offline Containerfile's but for where the files come from, so that
// both images are configured alike.
func TestImageDockerfile(t *testing.T) {
	final := func(path string) []string {
		t.Helper()
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		s := string(b)
		i := strings.LastIndex(s, "\nFROM scratch\n")
		if i < 0 {
			t.Fatalf("%s: no FROM scratch stage", path)
		}
		var lines []string
		for _, l := range strings.Split(s[i+1:], "\n") {
			if strings.HasPrefix(l, "#") || strings.HasPrefix(l, "COPY ") || strings.TrimSpace(l) == "" {
				continue
			}
			lines = append(lines, l)
		}
		return lines
	}
	docker := final(filepath.Join(repoRoot, "Dockerfile"))
	offline := final(filepath.Join(repoRoot, "deploy", "image", "Containerfile"))
	if !slices.Equal(docker, offline) {
		t.Errorf("the final stages differ:\nDockerfile:\n%s\nContainerfile:\n%s", strings.Join(docker, "\n"), strings.Join(offline, "\n"))
	}
}
