package deploytest

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// update rewrites deploy/kubernetes from the chart (make manifests).
var update = flag.Bool("update", false, "rewrite the manifests of deploy/kubernetes from the chart")

// repoRoot is the repository's root, from this package's directory.
const repoRoot = "../.."

var chartDir = filepath.Join(repoRoot, "deploy", "helm", "idem")

// tool returns the path of a tool the Makefile provides in the
// environment variable name, or fails the test.
func tool(t *testing.T, name, target string) string {
	t.Helper()
	p := os.Getenv(name)
	if p == "" {
		t.Fatalf("%s is not set: run these tests with make %s, which provides it", name, target)
	}
	return p
}

// helmTemplate renders the chart with args (-f FILE, --set ...) and
// returns the output, or the error helm printed.
func helmTemplate(t *testing.T, args ...string) (string, error) {
	t.Helper()
	helm := tool(t, "IDEM_HELM", "chart-test")
	cmd := exec.Command(helm, append([]string{"template", "idem", chartDir, "--namespace", "default"}, args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("helm template %s: %v: %s", strings.Join(args, " "), err, stderr.String())
	}
	return stdout.String(), nil
}

// The parts of the rendered objects the tests read.
type object struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name   string            `json:"name"`
		Labels map[string]string `json:"labels"`
	} `json:"metadata"`
	Spec struct {
		Replicas *int `json:"replicas"`
		Strategy struct {
			Type string `json:"type"`
		} `json:"strategy"`
		Selector struct {
			MatchLabels map[string]string `json:"matchLabels"`
		} `json:"selector"`
		Template struct {
			Metadata struct {
				Labels map[string]string `json:"labels"`
			} `json:"metadata"`
			Spec podSpec `json:"spec"`
		} `json:"template"`
		// Service
		Ports []struct {
			Name       string `json:"name"`
			Port       int    `json:"port"`
			TargetPort any    `json:"targetPort"`
		} `json:"ports"`
		// ServiceMonitor
		Endpoints []struct {
			Port string `json:"port"`
			Path string `json:"path"`
		} `json:"endpoints"`
		// PodDisruptionBudget
		MaxUnavailable any `json:"maxUnavailable"`
	} `json:"spec"`
	// A Service's selector is spec.selector, a map.
	serviceSelector map[string]string
}

type podSpec struct {
	Containers      []container `json:"containers"`
	SecurityContext struct {
		FSGroup *int `json:"fsGroup"`
	} `json:"securityContext"`
	TerminationGracePeriodSeconds int `json:"terminationGracePeriodSeconds"`
	Volumes                       []struct {
		Name                  string    `json:"name"`
		EmptyDir              *struct{} `json:"emptyDir"`
		PersistentVolumeClaim *struct {
			ClaimName string `json:"claimName"`
		} `json:"persistentVolumeClaim"`
	} `json:"volumes"`
}

type container struct {
	Name  string   `json:"name"`
	Image string   `json:"image"`
	Args  []string `json:"args"`
	Env   []struct {
		Name      string `json:"name"`
		Value     string `json:"value"`
		ValueFrom *struct {
			SecretKeyRef *struct {
				Name     string `json:"name"`
				Key      string `json:"key"`
				Optional bool   `json:"optional"`
			} `json:"secretKeyRef"`
		} `json:"valueFrom"`
	} `json:"env"`
	Ports []struct {
		Name          string `json:"name"`
		ContainerPort int    `json:"containerPort"`
	} `json:"ports"`
	LivenessProbe  *probe `json:"livenessProbe"`
	ReadinessProbe *probe `json:"readinessProbe"`
	Lifecycle      *struct {
		PreStop *struct {
			Sleep *struct {
				Seconds int `json:"seconds"`
			} `json:"sleep"`
		} `json:"preStop"`
	} `json:"lifecycle"`
	Resources struct {
		Requests map[string]string `json:"requests"`
		Limits   map[string]string `json:"limits"`
	} `json:"resources"`
	SecurityContext *struct {
		RunAsNonRoot             *bool `json:"runAsNonRoot"`
		RunAsUser                *int  `json:"runAsUser"`
		ReadOnlyRootFilesystem   *bool `json:"readOnlyRootFilesystem"`
		AllowPrivilegeEscalation *bool `json:"allowPrivilegeEscalation"`
		Capabilities             struct {
			Drop []string `json:"drop"`
		} `json:"capabilities"`
	} `json:"securityContext"`
	VolumeMounts []struct {
		Name      string `json:"name"`
		MountPath string `json:"mountPath"`
	} `json:"volumeMounts"`
}

type probe struct {
	HTTPGet *struct {
		Path string `json:"path"`
		Port any    `json:"port"`
	} `json:"httpGet"`
}

// env returns the container's variable name: its value, or
// "secret:NAME/KEY" for one read from a Secret.
func (c container) env() map[string]string {
	m := map[string]string{}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil:
			m[e.Name] = "secret:" + e.ValueFrom.SecretKeyRef.Name + "/" + e.ValueFrom.SecretKeyRef.Key
		default:
			m[e.Name] = e.Value
		}
	}
	return m
}

// parseObjects splits helm's output into objects.
func parseObjects(t *testing.T, out string) []object {
	t.Helper()
	var objs []object
	for _, doc := range strings.Split(out, "\n---") {
		if strings.TrimSpace(stripComments(doc)) == "" {
			continue
		}
		js, err := yaml.YAMLToJSON([]byte(doc))
		if err != nil {
			t.Fatalf("rendered YAML: %v\n%s", err, doc)
		}
		var o object
		if err := json.Unmarshal(js, &o); err != nil {
			t.Fatalf("rendered object: %v\n%s", err, doc)
		}
		if o.Kind == "Service" {
			var s struct {
				Spec struct {
					Selector map[string]string `json:"selector"`
				} `json:"spec"`
			}
			_ = json.Unmarshal(js, &s)
			o.serviceSelector = s.Spec.Selector
		}
		objs = append(objs, o)
	}
	return objs
}

func stripComments(doc string) string {
	var b strings.Builder
	for _, l := range strings.Split(doc, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "#") {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

func kinds(objs []object) []string {
	var ks []string
	for _, o := range objs {
		ks = append(ks, o.Kind)
	}
	slices.Sort(ks)
	return ks
}

func find(t *testing.T, objs []object, kind string) object {
	t.Helper()
	for _, o := range objs {
		if o.Kind == kind {
			return o
		}
	}
	t.Fatalf("no %s in %v", kind, kinds(objs))
	return object{}
}

func containerNamed(t *testing.T, d object, name string) container {
	t.Helper()
	for _, c := range d.Spec.Template.Spec.Containers {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("no container %s in the Deployment", name)
	return container{}
}

// checkIdemContainer checks what every idem container of the chart has:
// the chart's image, user 65532 on a read-only root filesystem with no
// capabilities, requests and a memory limit, and /data mounted.
func checkIdemContainer(t *testing.T, c container) {
	t.Helper()
	if c.Image != "idem:v0.1.0" {
		t.Errorf("%s: image: got %q, want idem:v0.1.0 (the chart's appVersion)", c.Name, c.Image)
	}
	sc := c.SecurityContext
	switch {
	case sc == nil:
		t.Errorf("%s: no securityContext", c.Name)
	case sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || sc.RunAsUser == nil || *sc.RunAsUser != 65532:
		t.Errorf("%s: securityContext: want runAsNonRoot and runAsUser 65532", c.Name)
	case sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem:
		t.Errorf("%s: securityContext: want readOnlyRootFilesystem", c.Name)
	case sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation || !slices.Equal(sc.Capabilities.Drop, []string{"ALL"}):
		t.Errorf("%s: securityContext: want no privilege escalation and every capability dropped", c.Name)
	}
	if c.Resources.Requests["cpu"] == "" || c.Resources.Requests["memory"] == "" || c.Resources.Limits["memory"] == "" {
		t.Errorf("%s: resources: got %+v, want cpu and memory requests and a memory limit", c.Name, c.Resources)
	}
	if len(c.VolumeMounts) != 1 || c.VolumeMounts[0].MountPath != "/data" {
		t.Errorf("%s: volumeMounts: got %+v, want data on /data", c.Name, c.VolumeMounts)
	}
}

// checkProxyContainer checks the proxy's container: its ports, the
// probes on the admin port and the preStop sleep.
func checkProxyContainer(t *testing.T, c container, upstream string) {
	t.Helper()
	checkIdemContainer(t, c)
	if c.Args[0] != "proxy" {
		t.Errorf("args: got %q, want proxy first", c.Args)
	}
	env := c.env()
	for k, want := range map[string]string{
		"IDEM_UPSTREAM": upstream, "IDEM_LISTEN": "0.0.0.0:8080", "IDEM_ADMIN_LISTEN": "0.0.0.0:9090",
	} {
		if env[k] != want {
			t.Errorf("env %s: got %q, want %q", k, env[k], want)
		}
	}
	ports := map[string]int{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	if ports["http"] != 8080 || ports["admin"] != 9090 {
		t.Errorf("ports: got %v, want http 8080 and admin 9090", ports)
	}
	for _, p := range []struct {
		name string
		p    *probe
		path string
	}{{"liveness", c.LivenessProbe, "/healthz"}, {"readiness", c.ReadinessProbe, "/readyz"}} {
		if p.p == nil || p.p.HTTPGet == nil || p.p.HTTPGet.Path != p.path || p.p.HTTPGet.Port != "admin" {
			t.Errorf("%s probe: got %+v, want GET %s on the admin port", p.name, p.p, p.path)
		}
	}
	if c.Lifecycle == nil || c.Lifecycle.PreStop == nil || c.Lifecycle.PreStop.Sleep == nil || c.Lifecycle.PreStop.Sleep.Seconds != 5 {
		t.Errorf("lifecycle: got %+v, want a preStop sleep of 5s", c.Lifecycle)
	}
}

// TestChart renders the chart with its default values and the value sets
// of its ci/ directory, checks what each must hold, and validates every
// object against the schemas of each Kubernetes release the Makefile names
// (and the ServiceMonitor CRD's) with kubeconform.
func TestChart(t *testing.T) {
	helm := tool(t, "IDEM_HELM", "chart-test")
	lintArgs := [][]string{{"--set", "proxy.upstream=http://api:8080"}}
	for _, set := range []string{"redis", "sentinel", "postgres", "cluster"} {
		lintArgs = append(lintArgs, []string{"-f", filepath.Join(chartDir, "ci", set+"-values.yaml")})
	}
	for _, args := range lintArgs {
		out, err := exec.Command(helm, append([]string{"lint", "--strict", chartDir}, args...)...).CombinedOutput()
		if err != nil {
			t.Errorf("helm lint --strict %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}

	schemas := kubeSchemas(t)
	cases := []struct {
		name  string
		args  []string
		kinds []string
		check func(t *testing.T, objs []object)
	}{
		{"default", []string{"--set", "proxy.upstream=http://api:8080"}, []string{"Deployment", "PodDisruptionBudget", "Service"}, func(t *testing.T, objs []object) {
			d := find(t, objs, "Deployment")
			if *d.Spec.Replicas != 1 || d.Spec.Strategy.Type != "Recreate" {
				t.Errorf("embedded store: got %d replicas, strategy %q; want 1 and Recreate", *d.Spec.Replicas, d.Spec.Strategy.Type)
			}
			c := containerNamed(t, d, "idem-proxy")
			checkProxyContainer(t, c, "http://api:8080")
			if got := c.env()["IDEM_DATA"]; got != "/data" {
				t.Errorf("IDEM_DATA: got %q, want /data", got)
			}
			if v := d.Spec.Template.Spec.Volumes; len(v) != 1 || v[0].EmptyDir == nil {
				t.Errorf("volumes: got %+v, want data as an emptyDir", v)
			}
			if g := d.Spec.Template.Spec.SecurityContext.FSGroup; g == nil || *g != 65532 {
				t.Errorf("pod fsGroup: got %v, want 65532 (the volume writable by idem)", g)
			}
			if got := d.Spec.Template.Spec.TerminationGracePeriodSeconds; got != 75 {
				t.Errorf("terminationGracePeriodSeconds: got %d, want 75", got)
			}
			s := find(t, objs, "Service")
			if s.serviceSelector["app.kubernetes.io/component"] != "proxy" || len(s.Spec.Ports) != 2 || s.Spec.Ports[0].TargetPort != "http" {
				t.Errorf("Service: got selector %v, ports %+v; want the proxy's http and admin ports", s.serviceSelector, s.Spec.Ports)
			}
		}},
		{"redis", []string{"-f", filepath.Join(chartDir, "ci", "redis-values.yaml")}, []string{"Deployment", "PodDisruptionBudget", "Service", "ServiceMonitor"}, func(t *testing.T, objs []object) {
			d := find(t, objs, "Deployment")
			if *d.Spec.Replicas != 3 || d.Spec.Strategy.Type == "Recreate" {
				t.Errorf("got %d replicas, strategy %q; want 3, rolling", *d.Spec.Replicas, d.Spec.Strategy.Type)
			}
			c := containerNamed(t, d, "idem-proxy")
			checkProxyContainer(t, c, "http://payments.default.svc.cluster.local:8080")
			env := c.env()
			if env["IDEM_REDIS"] != "secret:idem-redis/url" || env["IDEM_REDIS_PREFIX"] != "idem:" {
				t.Errorf("env: got %v, want IDEM_REDIS from the Secret idem-redis, key url, and the prefix", env)
			}
			if _, ok := env["IDEM_DATA"]; ok {
				t.Errorf("env: IDEM_DATA set with a Redis store")
			}
			if !slices.Equal(c.Args, []string{"proxy", "--scope-header", "Authorization"}) {
				t.Errorf("args: got %q, want proxy --scope-header Authorization", c.Args)
			}
			sm := find(t, objs, "ServiceMonitor")
			if len(sm.Spec.Endpoints) != 1 || sm.Spec.Endpoints[0].Port != "admin" || sm.Spec.Endpoints[0].Path != "/metrics" {
				t.Errorf("ServiceMonitor endpoints: got %+v, want /metrics on admin", sm.Spec.Endpoints)
			}
			if sm.Metadata.Labels["release"] != "prometheus" || sm.Spec.Selector.MatchLabels["app.kubernetes.io/component"] != "proxy" {
				t.Errorf("ServiceMonitor: labels %v, selector %v", sm.Metadata.Labels, sm.Spec.Selector.MatchLabels)
			}
		}},
		{"sentinel", []string{"-f", filepath.Join(chartDir, "ci", "sentinel-values.yaml")}, []string{"Deployment", "PodDisruptionBudget", "Service"}, func(t *testing.T, objs []object) {
			d := find(t, objs, "Deployment")
			var names []string
			for _, c := range d.Spec.Template.Spec.Containers {
				names = append(names, c.Name)
			}
			if !slices.Equal(names, []string{"payments", "idem-proxy"}) {
				t.Fatalf("containers: got %q, want payments and its idem-proxy sidecar", names)
			}
			c := containerNamed(t, d, "idem-proxy")
			checkProxyContainer(t, c, "http://127.0.0.1:9000")
			env := c.env()
			want := map[string]string{
				"IDEM_REDIS_SENTINEL":          "mymaster@redis-sentinel-0.redis-sentinel:26379,redis-sentinel-1.redis-sentinel:26379,redis-sentinel-2.redis-sentinel:26379",
				"IDEM_REDIS_SENTINEL_PASSWORD": "secret:idem-sentinel/sentinel-password",
				"IDEM_REDIS_USERNAME":          "secret:idem-sentinel/username",
				"IDEM_REDIS_PASSWORD":          "secret:idem-sentinel/password",
			}
			for k, v := range want {
				if env[k] != v {
					t.Errorf("env %s: got %q, want %q", k, env[k], v)
				}
			}
			s := find(t, objs, "Service")
			if s.serviceSelector["app.kubernetes.io/component"] != "app" {
				t.Errorf("Service selector: got %v, want the app's pods", s.serviceSelector)
			}
			if app := containerNamed(t, d, "payments"); app.SecurityContext != nil {
				t.Errorf("the app's container got idem's securityContext: %+v", app.SecurityContext)
			}
		}},
		{"postgres", []string{"-f", filepath.Join(chartDir, "ci", "postgres-values.yaml")}, []string{"Deployment", "PodDisruptionBudget"}, func(t *testing.T, objs []object) {
			d := find(t, objs, "Deployment")
			c := containerNamed(t, d, "idem-consume")
			checkIdemContainer(t, c)
			wantArgs := []string{"consume", "--from", "redis-stream://redis.default.svc:6379/orders?group=billing",
				"--to", "http://127.0.0.1:9000/orders", "--concurrency", "8", "--max-deliveries", "5"}
			if !slices.Equal(c.Args, wantArgs) {
				t.Errorf("args: got %q, want %q", c.Args, wantArgs)
			}
			for _, p := range []struct {
				name string
				p    *probe
				path string
			}{{"liveness", c.LivenessProbe, "/healthz"}, {"readiness", c.ReadinessProbe, "/readyz"}} {
				if p.p == nil || p.p.HTTPGet == nil || p.p.HTTPGet.Path != p.path || p.p.HTTPGet.Port != "consume-admin" {
					t.Errorf("idem-consume's %s probe: got %+v, want GET %s on consume-admin", p.name, p.p, p.path)
				}
			}
			if got := c.env()["IDEM_ADMIN_LISTEN"]; got != "0.0.0.0:9091" {
				t.Errorf("idem-consume's IDEM_ADMIN_LISTEN: got %q, want 0.0.0.0:9091", got)
			}
			if got := c.env()["IDEM_POSTGRES"]; got != "secret:idem-postgres/url" {
				t.Errorf("IDEM_POSTGRES: got %q, want the Secret idem-postgres, key url", got)
			}
			if len(d.Spec.Template.Spec.Containers) != 2 {
				t.Errorf("containers: got %d, want the worker and idem-consume", len(d.Spec.Template.Spec.Containers))
			}
		}},
		{"cluster", []string{"-f", filepath.Join(chartDir, "ci", "cluster-values.yaml")}, []string{"Deployment", "PodDisruptionBudget", "Service"}, func(t *testing.T, objs []object) {
			c := containerNamed(t, find(t, objs, "Deployment"), "idem-proxy")
			env := c.env()
			if env["IDEM_REDIS_CLUSTER"] != "secret:idem-cluster/url" || env["IDEM_REDIS_PASSWORD"] != "secret:idem-cluster/password" {
				t.Errorf("env: got %v, want IDEM_REDIS_CLUSTER and IDEM_REDIS_PASSWORD from the Secret idem-cluster", env)
			}
		}},
		{"embedded with a volume", []string{"--set", "proxy.upstream=http://api:8080", "--set", "store.persistence.enabled=true"}, []string{"Deployment", "PersistentVolumeClaim", "PodDisruptionBudget", "Service"}, func(t *testing.T, objs []object) {
			v := find(t, objs, "Deployment").Spec.Template.Spec.Volumes
			if len(v) != 1 || v[0].PersistentVolumeClaim == nil || v[0].PersistentVolumeClaim.ClaimName != "idem-data" {
				t.Errorf("volumes: got %+v, want the claim idem-data", v)
			}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			out, err := helmTemplate(t, tc.args...)
			if err != nil {
				t.Fatal(err)
			}
			objs := parseObjects(t, out)
			if got := kinds(objs); !slices.Equal(got, tc.kinds) {
				t.Errorf("kinds: got %v, want %v", got, tc.kinds)
			}
			tc.check(t, objs)
			kubeconform(t, schemas, out, len(objs))
		})
	}
}

// TestChartRefuses: values the chart cannot serve safely fail the
// rendering with a message that names the value to set.
func TestChartRefuses(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"no upstream", nil, "proxy.upstream"},
		{"embedded, two replicas", []string{"--set", "proxy.upstream=http://api:8080", "--set", "proxy.replicaCount=2"}, "store.type embedded with 2 replicas"},
		{"redis without a Secret", []string{"--set", "proxy.upstream=http://api:8080", "--set", "store.type=redis"}, "store.existingSecret"},
		{"sentinel without Sentinels", []string{"--set", "proxy.upstream=http://api:8080", "--set", "store.type=redis-sentinel", "--set", "store.existingSecret=s"}, "store.sentinel.addresses"},
		{"unknown store", []string{"--set", "proxy.upstream=http://api:8080", "--set", "store.type=memcached"}, `store.type "memcached"`},
		{"consume on the embedded store", []string{"--set", "proxy.enabled=false", "--set", "app.enabled=true", "--set", "app.image=x:1",
			"--set", "app.replicaCount=1", "--set", "app.consume.enabled=true", "--set", "app.consume.from=amqp://mq/q"}, "idem consume refuses the embedded store"},
		{"consume without --from", []string{"--set", "proxy.enabled=false", "--set", "app.enabled=true", "--set", "app.image=x:1",
			"--set", "store.type=redis", "--set", "store.existingSecret=s", "--set", "app.proxySidecar=false", "--set", "app.consume.enabled=true"}, "app.consume.from"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := helmTemplate(t, tc.args...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want an error naming %q", err, tc.want)
			}
		})
	}
}

// TestKubeconformRejects is the control of the schema check: objects with
// an unknown field, a field of the wrong type and a missing required field
// must be reported invalid, so that a valid verdict means something.
func TestKubeconformRejects(t *testing.T) {
	schemas := kubeSchemas(t)
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"unknown field", []string{"--set", "proxy.upstream=http://api:8080", "--set-json", `proxy.extraEnv=[{"name":"A","valu":"b"}]`}, "additional properties 'valu' not allowed"},
		{"wrong type", []string{"-f", filepath.Join(chartDir, "ci", "redis-values.yaml"), "--set-json", "metrics.serviceMonitor.interval=5"}, "/spec/endpoints/0/interval"},
		{"missing required field", []string{"--set", "proxy.upstream=http://api:8080", "--set-json", `proxy.extraEnv=[{"value":"b"}]`}, "missing property 'name'"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := helmTemplate(t, tc.args...)
			if err != nil {
				t.Fatal(err)
			}
			for _, set := range schemas {
				res := runKubeconform(t, set.dir, out)
				var invalid []string
				for _, r := range res.Resources {
					if r.Status == "statusInvalid" {
						invalid = append(invalid, r.Msg)
					}
				}
				if len(invalid) != 1 || !strings.Contains(invalid[0], tc.want) {
					t.Errorf("Kubernetes %s: invalid objects: got %q, want one saying %q", set.release, invalid, tc.want)
				}
			}
		})
	}
}

// schemaSet is the schema directory of one Kubernetes release.
type schemaSet struct {
	release string // v1.37.2
	dir     string
}

// kubeSchemas converts the OpenAPI documents of the Kubernetes releases
// the Makefile names (IDEM_K8S_OPENAPI, a list of paths separated by
// colons) and the ServiceMonitor CRD (IDEM_SERVICEMONITOR_CRD) into a
// schema directory per release for kubeconform.
func kubeSchemas(t *testing.T) []schemaSet {
	t.Helper()
	crd := tool(t, "IDEM_SERVICEMONITOR_CRD", "chart-test")
	var sets []schemaSet
	for _, openapi := range strings.Split(tool(t, "IDEM_K8S_OPENAPI", "chart-test"), ":") {
		openapi = strings.TrimSpace(openapi)
		if openapi == "" {
			continue
		}
		// .../k8s.io/kubernetes@v1.37.2/api/openapi-spec/swagger.json
		_, release, ok := strings.Cut(openapi, "kubernetes@")
		release, _, _ = strings.Cut(release, "/")
		if !ok || release == "" {
			t.Fatalf("IDEM_K8S_OPENAPI: %s is not in a k8s.io/kubernetes module", openapi)
		}
		dir := t.TempDir()
		got, err := WriteSchemas(dir, openapi, crd)
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{"deployment-apps-v1", "service-v1", "poddisruptionbudget-policy-v1", "persistentvolumeclaim-v1", "servicemonitor-monitoring-v1"} {
			if !slices.Contains(got, want) {
				t.Fatalf("schemas of %s: no %s among %d", release, want, len(got))
			}
		}
		sets = append(sets, schemaSet{release, dir})
	}
	if len(sets) == 0 {
		t.Fatal("IDEM_K8S_OPENAPI names no OpenAPI document")
	}
	return sets
}

type kubeconformResult struct {
	Resources []struct {
		Kind   string `json:"kind"`
		Name   string `json:"name"`
		Status string `json:"status"`
		Msg    string `json:"msg"`
	} `json:"resources"`
}

func runKubeconform(t *testing.T, schemas, manifests string) kubeconformResult {
	t.Helper()
	kc := tool(t, "IDEM_KUBECONFORM", "chart-test")
	cmd := exec.Command(kc, "-strict", "-verbose", "-output", "json",
		"-schema-location", filepath.Join(schemas, "{{ .ResourceKind }}{{ .KindSuffix }}.json"), "-")
	cmd.Stdin = strings.NewReader(manifests)
	out, err := cmd.Output()
	var res kubeconformResult
	if jerr := json.Unmarshal(out, &res); jerr != nil {
		t.Fatalf("kubeconform: %v, %v\n%s", err, jerr, out)
	}
	return res
}

// kubeconform validates manifests, which hold n objects, against each
// Kubernetes release: each object must be found valid (one without a
// schema is an error, not a skip).
func kubeconform(t *testing.T, sets []schemaSet, manifests string, n int) {
	t.Helper()
	for _, set := range sets {
		res := runKubeconform(t, set.dir, manifests)
		if len(res.Resources) != n {
			t.Errorf("kubeconform, Kubernetes %s: got %d results, want %d", set.release, len(res.Resources), n)
		}
		for _, r := range res.Resources {
			if r.Status != "statusValid" {
				t.Errorf("kubeconform, Kubernetes %s: %s %s: %s %s", set.release, r.Kind, r.Name, r.Status, r.Msg)
			}
		}
	}
}

// manifestSets are the plain manifests of deploy/kubernetes: each file is
// the chart rendered with the values file of the same name under
// deploy/kubernetes/values.
var manifestSets = []string{"proxy", "sidecar", "worker"}

// renderManifest renders deploy/kubernetes/<name>.yaml: the chart with
// its values file, without what only Helm uses (the chart's label, the
// managed-by label and the source comments).
func renderManifest(t *testing.T, name string) string {
	t.Helper()
	values := filepath.Join(repoRoot, "deploy", "kubernetes", "values", name+".yaml")
	out, err := helmTemplate(t, "-f", values)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "# Generated by `make manifests` from the chart deploy/helm/idem with\n# values/%s.yaml: edit those and run it again. See docs/deploy.md.\n", name)
	// The header belongs to the first object, so that it is no document
	// of its own.
	for _, l := range strings.Split(strings.TrimPrefix(out, "---\n"), "\n") {
		trimmed := strings.TrimSpace(l)
		if strings.HasPrefix(trimmed, "# Source:") || strings.HasPrefix(trimmed, "helm.sh/chart:") || trimmed == "app.kubernetes.io/managed-by: Helm" {
			continue
		}
		b.WriteString(l + "\n")
	}
	return strings.TrimRight(b.String(), "\n") + "\n"
}

// TestManifests: the plain manifests are the chart's rendering (make
// manifests rewrites them) and pass the schema check.
func TestManifests(t *testing.T) {
	schemas := kubeSchemas(t)
	for _, name := range manifestSets {
		t.Run(name, func(t *testing.T) {
			want := renderManifest(t, name)
			path := filepath.Join(repoRoot, "deploy", "kubernetes", name+".yaml")
			if *update {
				if err := os.WriteFile(path, []byte(want), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			got, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != want {
				t.Errorf("%s differs from the chart's rendering: run make manifests", path)
			}
			kubeconform(t, schemas, string(got), len(parseObjects(t, string(got))))
		})
	}
}
