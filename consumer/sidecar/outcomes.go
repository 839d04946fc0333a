package sidecar

import (
	"unicode/utf8"
	"unsafe"
)

// parseOutcomes is readOutcomes' fast path for the common shape of a
// batch's answer: an array of objects whose members are only "status"
// (an integer from 1 to 999999999), "body" and "encoding" (strings with
// no \u escape), lowercase, with any JSON white space. It decodes such an
// answer into exactly what encoding/json.Unmarshal would
// (FuzzParseOutcomes) and reports ok false for anything else, which
// readOutcomes then hands to encoding/json. It never writes blob: a
// string without escapes is read in place, one with escapes is undone
// into one buffer for the whole answer.
func parseOutcomes(blob []byte, n int) (outs []BatchOutcome, ok bool) {
	p := &outcomeParser{b: blob}
	p.ws()
	if !p.eat('[') {
		return nil, false
	}
	outs = make([]BatchOutcome, 0, n)
	p.ws()
	if p.eat(']') {
		p.ws()
		return outs, p.i == len(p.b)
	}
	for {
		var o BatchOutcome
		if !p.object(&o) {
			return nil, false
		}
		outs = append(outs, o)
		p.ws()
		if p.eat(']') {
			break
		}
		if !p.eat(',') {
			return nil, false
		}
		p.ws()
	}
	p.ws()
	return outs, p.i == len(p.b)
}

type outcomeParser struct {
	b   []byte
	i   int
	out []byte // the strings with escapes, undone; never grown past its first capacity
}

func (p *outcomeParser) ws() {
	for p.i < len(p.b) {
		switch p.b[p.i] {
		case ' ', '\t', '\n', '\r':
			p.i++
		default:
			return
		}
	}
}

func (p *outcomeParser) eat(c byte) bool {
	if p.i < len(p.b) && p.b[p.i] == c {
		p.i++
		return true
	}
	return false
}

// object parses one outcome's object into o.
func (p *outcomeParser) object(o *BatchOutcome) bool {
	if !p.eat('{') {
		return false
	}
	p.ws()
	if p.eat('}') {
		return true
	}
	for {
		name, ok := p.str()
		if !ok {
			return false
		}
		p.ws()
		if !p.eat(':') {
			return false
		}
		p.ws()
		switch name {
		case "status":
			if o.Status, ok = p.int(); !ok {
				return false
			}
		case "body":
			if o.Body, ok = p.str(); !ok {
				return false
			}
		case "encoding":
			if o.Encoding, ok = p.str(); !ok {
				return false
			}
		default:
			return false
		}
		p.ws()
		if p.eat('}') {
			return true
		}
		if !p.eat(',') {
			return false
		}
		p.ws()
	}
}

// int parses a positive integer of at most 9 digits without a leading 0.
func (p *outcomeParser) int() (int, bool) {
	start, v := p.i, 0
	for p.i < len(p.b) && p.b[p.i] >= '0' && p.b[p.i] <= '9' && p.i-start < 9 {
		v = 10*v + int(p.b[p.i]-'0')
		p.i++
	}
	if p.i == start || p.b[start] == '0' || p.i < len(p.b) && (p.b[p.i] >= '0' && p.b[p.i] <= '9' || p.b[p.i] == '.' || p.b[p.i] == 'e' || p.b[p.i] == 'E') {
		return 0, false
	}
	return v, true
}

// str parses a string of valid UTF-8 with the escapes \" \\ \/ \b \f \n
// \r \t (not \u).
func (p *outcomeParser) str() (string, bool) {
	if !p.eat('"') {
		return "", false
	}
	start := p.i
	for p.i < len(p.b) && p.b[p.i] != '"' && p.b[p.i] != '\\' && p.b[p.i] >= 0x20 {
		p.i++
	}
	if p.i < len(p.b) && p.b[p.i] == '"' {
		p.i++
		return validString(p.b[start : p.i-1])
	}
	p.i = start
	return p.escaped()
}

// validString is s as a string, without a copy, if it is valid UTF-8.
func validString(s []byte) (string, bool) {
	if !utf8.Valid(s) {
		return "", false
	}
	return unsafe.String(unsafe.SliceData(s), len(s)), true
}

// escaped is str for a string with escapes, from its first byte: undone
// into p.out, which holds at most len(p.b) bytes and so never moves.
func (p *outcomeParser) escaped() (string, bool) {
	if p.out == nil {
		p.out = make([]byte, 0, len(p.b))
	}
	start := len(p.out)
	for p.i < len(p.b) {
		c := p.b[p.i]
		switch {
		case c == '"':
			p.i++
			return validString(p.out[start:])
		case c < 0x20:
			return "", false
		case c == '\\':
			if p.i+1 >= len(p.b) {
				return "", false
			}
			switch e := p.b[p.i+1]; e {
			case '"', '\\', '/':
				c = e
			case 'b':
				c = '\b'
			case 'f':
				c = '\f'
			case 'n':
				c = '\n'
			case 'r':
				c = '\r'
			case 't':
				c = '\t'
			default:
				return "", false
			}
			p.i++
		}
		p.out = append(p.out, c)
		p.i++
	}
	return "", false
}
