// Package httpsyntax holds the checks of HTTP syntax that idemhttp and
// idemproxy share, so that both accept the same field names and methods.
package httpsyntax

import "strings"

// IsToken reports whether s is an RFC 9110 token, the syntax of field
// names and methods.
func IsToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' {
			continue
		}
		if !strings.ContainsRune("!#$%&'*+-.^_`|~", rune(c)) {
			return false
		}
	}
	return true
}
