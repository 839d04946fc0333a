package readmetest

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"
)

// root is the repository's root, from this package's directory.
const root = "../.."

// skipDir reports whether a directory holds no document of the repository
// (build output, caches, test data).
func skipDir(name string) bool {
	switch name {
	case ".git", ".cache", "bin", "dist", "node_modules", "testdata", "idem-data":
		return true
	}
	return false
}

// repoFiles returns the repository's files whose names end in one of exts,
// relative to root, with slashes.
func repoFiles(t *testing.T, exts ...string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if p != root && skipDir(d.Name()) {
				return filepath.SkipDir
			}
			return nil
		}
		for _, e := range exts {
			if strings.HasSuffix(p, e) {
				rel, _ := filepath.Rel(root, p)
				out = append(out, filepath.ToSlash(rel))
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// Anchors returns the anchors of a Markdown document: GitHub's slugs of
// its headings (lower case, punctuation dropped, spaces as hyphens, a
// repeated heading numbered -1, -2, …) and the ids of its HTML anchors.
func anchors(text string) map[string]bool {
	out := map[string]bool{}
	inCode := false
	for line := range strings.Lines(text) {
		line = strings.TrimRight(line, "\n")
		if strings.HasPrefix(line, "```") {
			inCode = !inCode
			continue
		}
		if inCode {
			continue
		}
		for _, m := range htmlAnchor.FindAllStringSubmatch(line, -1) {
			out[m[1]] = true
		}
		if !strings.HasPrefix(line, "#") {
			continue
		}
		h := strings.TrimSpace(strings.TrimLeft(line, "#"))
		var b strings.Builder
		for _, r := range strings.ToLower(h) {
			switch {
			case unicode.IsLetter(r) || unicode.IsDigit(r) || r == '-' || r == '_':
				b.WriteRune(r)
			case r == ' ':
				b.WriteRune('-')
			}
		}
		slug := b.String()
		for i := 1; out[slug]; i++ {
			if s := b.String() + "-" + itoa(i); !out[s] {
				slug = s
			}
		}
		out[slug] = true
	}
	return out
}

func itoa(i int) string {
	if i < 10 {
		return string(rune('0' + i))
	}
	return itoa(i/10) + string(rune('0'+i%10))
}

var (
	htmlAnchor = regexp.MustCompile(`<a (?:id|name)="([^"]+)"`)
	// mdLink is a Markdown link or image: its target, without a title.
	mdLink = regexp.MustCompile(`\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)
	// docCite is a citation of a document in a Go comment or a Markdown
	// text: a path ending in .md, with an optional section anchor.
	docCite = regexp.MustCompile(`(?:[A-Za-z0-9_.-]+/)*[A-Za-z0-9_-]+\.md(?:#[A-Za-z0-9_-]+)?`)
)

// dangling returns the dangling references of the repository: Markdown
// links (in every .md file, outside code blocks) to a file that does not
// exist or to an anchor its document lacks, and documents cited in the
// comments of Go, Lua and SQL files (a path ending in .md, with an optional
// #anchor, such as docs/design.md#the-commit-gate) that do not exist or
// lack that section. A cited path is looked for beside the citing file, in the
// directories above it and at the root.
func dangling(t *testing.T) []string {
	t.Helper()
	docAnchors := map[string]map[string]bool{}
	anchorsOf := func(rel string) map[string]bool {
		if a, ok := docAnchors[rel]; ok {
			return a
		}
		b, err := os.ReadFile(filepath.Join(root, rel))
		a := map[string]bool{}
		if err == nil {
			a = anchors(string(b))
		}
		docAnchors[rel] = a
		return a
	}
	exists := func(rel string) bool {
		_, err := os.Stat(filepath.Join(root, rel))
		return err == nil
	}
	var bad []string
	check := func(from, target string, anywhereAbove bool) {
		path, anchor, _ := strings.Cut(target, "#")
		var resolved string
		if path == "" {
			resolved = from
		} else {
			dir := filepath.ToSlash(filepath.Dir(from))
			for {
				c := filepath.ToSlash(filepath.Clean(filepath.Join(dir, path)))
				if !strings.HasPrefix(c, "../") && exists(c) {
					resolved = c
					break
				}
				if !anywhereAbove || dir == "." {
					break
				}
				dir = filepath.ToSlash(filepath.Dir(dir))
			}
		}
		if resolved == "" {
			bad = append(bad, from+": "+target+": no such file")
			return
		}
		if anchor != "" && strings.HasSuffix(resolved, ".md") && !anchorsOf(resolved)[anchor] {
			bad = append(bad, from+": "+target+": no such section in "+resolved)
		}
	}
	for _, md := range repoFiles(t, ".md") {
		b, err := os.ReadFile(filepath.Join(root, md))
		if err != nil {
			t.Fatal(err)
		}
		inCode := false
		for line := range strings.Lines(string(b)) {
			if strings.HasPrefix(line, "```") {
				inCode = !inCode
				continue
			}
			if inCode {
				continue
			}
			for _, m := range mdLink.FindAllStringSubmatch(line, -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				check(md, target, false)
			}
		}
	}
	for _, src := range repoFiles(t, ".go", ".lua", ".sql") {
		b, err := os.ReadFile(filepath.Join(root, src))
		if err != nil {
			t.Fatal(err)
		}
		mark := "//"
		if !strings.HasSuffix(src, ".go") {
			mark = "--"
		}
		for line := range strings.Lines(string(b)) {
			_, comment, ok := strings.Cut(line, mark)
			if !ok {
				continue
			}
			for _, cite := range docCite.FindAllString(comment, -1) {
				check(src, cite, true)
			}
		}
	}
	return bad
}

// TestNoDanglingDocReferences fails on every link of a Markdown document
// and every document cited in a code comment that does not resolve: a file
// that does not exist, or a section anchor (docs/design.md#the-state-machine)
// that its document does not have.
func TestNoDanglingDocReferences(t *testing.T) {
	bad := dangling(t)
	for _, b := range bad {
		t.Error(b)
	}
	t.Logf("%d dangling doc references", len(bad))
}

func TestAnchors(t *testing.T) {
	a := anchors("# idem\n## Try it: the proxy, no Redis needed\n## `/metrics`, `/healthz` and logs\n```\n# not a heading\n```\n## Try it: the proxy, no Redis needed\n<a id=\"x\"></a>\n")
	for _, want := range []string{"idem", "try-it-the-proxy-no-redis-needed", "try-it-the-proxy-no-redis-needed-1", "metrics-healthz-and-logs", "x"} {
		if !a[want] {
			t.Errorf("anchors: got %v, want %q among them", a, want)
		}
	}
	if a["not-a-heading"] {
		t.Errorf("anchors: got a heading from a code block")
	}
}
