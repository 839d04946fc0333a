package readmetest

import (
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
)

// Command is one line of a shell block in a document: its words as sh
// splits them (single quotes kept together, ; and & as words of their
// own) and the comment that ends it, which says what the command answers.
type Command struct {
	Line    string
	Words   []string
	Comment string
}

// Commands returns the lines of the first ```sh block after the line of
// doc that contains marker. It fails t when there is none.
func Commands(t testing.TB, doc, marker string) []Command {
	t.Helper()
	block := fenced(t, doc, marker, "```sh\n", "shell block")
	var out []Command
	for line := range strings.Lines(block) {
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		words, comment := ShellWords(line)
		out = append(out, Command{Line: line, Words: words, Comment: comment})
	}
	return out
}

// fenced returns the text between open, the first one after the line of
// doc that contains marker, and the next ``` fence. It fails t, naming
// what, when there is none.
func fenced(t testing.TB, doc, marker, open, what string) string {
	t.Helper()
	text, err := os.ReadFile(doc)
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := strings.Cut(string(text), marker)
	if !ok {
		t.Fatalf("%s has no line with %q", doc, marker)
	}
	_, block, ok := strings.Cut(after, open)
	if !ok {
		t.Fatalf("%s has no %s after %q", doc, what, marker)
	}
	block, _, _ = strings.Cut(block, "```")
	return block
}

// ShellWords splits a command line the way sh does for the commands the
// documents show: words separated by blanks, single quotes kept together,
// ; and & as words of their own, a word starting with # beginning a
// comment.
func ShellWords(line string) (words []string, comment string) {
	var w strings.Builder
	inWord, quoted := false, false
	end := func() {
		if inWord {
			words = append(words, w.String())
			w.Reset()
			inWord = false
		}
	}
	for i := 0; i < len(line); i++ {
		c := line[i]
		switch {
		case quoted && c == '\'':
			quoted = false
		case quoted:
			w.WriteByte(c)
		case c == '\'':
			quoted, inWord = true, true
		case c == '\\' && i+1 < len(line):
			i++
			w.WriteByte(line[i])
			inWord = true
		case c == ' ' || c == '\t':
			end()
		case c == '#' && !inWord:
			return words, strings.TrimSpace(line[i+1:])
		case c == ';' || c == '&':
			end()
			words = append(words, string(c))
		default:
			w.WriteByte(c)
			inWord = true
		}
	}
	end()
	return words, ""
}

// CurlRequest returns the request of a curl command (its flags -s, -i,
// -X, -H and -d), sent to base instead of the host and port it names.
func CurlRequest(t testing.TB, c Command, base string) *http.Request {
	t.Helper()
	if len(c.Words) == 0 || c.Words[0] != "curl" {
		t.Fatalf("%q is not a curl command", c.Line)
	}
	method, target, header := "", "", http.Header{}
	var body io.Reader
	for i := 1; i < len(c.Words); i++ {
		switch w := c.Words[i]; w {
		case "-s", "-i", "-si":
		case "-X", "-H", "-d":
			if i+1 == len(c.Words) {
				t.Fatalf("%q: %s without a value", c.Line, w)
			}
			i++
			switch w {
			case "-X":
				method = c.Words[i]
			case "-H":
				name, value, _ := strings.Cut(c.Words[i], ":")
				header.Add(name, strings.TrimSpace(value))
			case "-d":
				body = strings.NewReader(c.Words[i])
				if method == "" {
					method = http.MethodPost
				}
			}
		default:
			if strings.HasPrefix(w, "-") || target != "" {
				t.Fatalf("%q: unknown argument %q", c.Line, w)
			}
			_, path, ok := strings.Cut(strings.TrimPrefix(w, "http://"), "/")
			if !ok {
				path = ""
			}
			target = "/" + path
		}
	}
	if method == "" {
		method = http.MethodGet
	}
	req, err := http.NewRequest(method, strings.TrimSuffix(base, "/")+target, body)
	if err != nil {
		t.Fatalf("%q: %v", c.Line, err)
	}
	req.Header = header
	return req
}
