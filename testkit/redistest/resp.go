package redistest

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"time"
)

// commandTimeout bounds one Command: dial, write and read.
const commandTimeout = 10 * time.Second

// ReplyError is an error reply from the server, such as
// "ERR unknown command" or "LOADING Redis is loading the dataset in memory".
// Command returns it as is, so that a test can tell it from a connection
// error with errors.As.
type ReplyError string

// Error returns the reply without the leading '-'.
func (e ReplyError) Error() string { return string(e) }

// Command sends one command to the server over a new connection and returns
// the reply as text, trimmed of surrounding white space: a status or bulk
// string as is, an integer in decimal, a nil reply as "", and an array as
// its elements, one per line (nested arrays flattened), as redis-cli prints
// them when its output is not a terminal. An error reply is returned as a
// ReplyError; a connection error or a timeout (10s) as another error.
// Command is safe for concurrent use.
func (s *Server) Command(args ...string) (string, error) {
	return command(s.Addr(), args...)
}

// command is Command for any address.
func command(addr string, args ...string) (string, error) {
	if len(args) == 0 {
		return "", errors.New("no command given")
	}
	replies, err := roundTrip(addr, commandTimeout, args)
	if err != nil {
		return "", err
	}
	if e, ok := replies[0].(ReplyError); ok {
		return "", e
	}
	var b strings.Builder
	render(&b, replies[0])
	return strings.TrimSpace(b.String()), nil
}

// render writes a reply as text in the format that Command documents.
func render(b *strings.Builder, v any) {
	switch v := v.(type) {
	case string:
		b.WriteString(v)
	case int64:
		b.WriteString(strconv.FormatInt(v, 10))
	case ReplyError:
		b.WriteString(string(v))
	case []any:
		for i, e := range v {
			if i > 0 {
				b.WriteByte('\n')
			}
			render(b, e)
		}
	case nil:
	}
}

// roundTrip sends commands pipelined on one connection to addr and reads one
// reply for each. Replies are string (status and bulk), int64, nil, []any or
// ReplyError. timeout bounds the whole exchange.
func roundTrip(addr string, timeout time.Duration, cmds ...[]string) ([]any, error) {
	deadline := time.Now().Add(timeout)
	conn, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	if err := conn.SetDeadline(deadline); err != nil {
		return nil, err
	}
	var req []byte
	for _, args := range cmds {
		req = append(req, '*')
		req = strconv.AppendInt(req, int64(len(args)), 10)
		req = append(req, "\r\n"...)
		for _, a := range args {
			req = append(req, '$')
			req = strconv.AppendInt(req, int64(len(a)), 10)
			req = append(req, "\r\n"...)
			req = append(req, a...)
			req = append(req, "\r\n"...)
		}
	}
	if _, err := conn.Write(req); err != nil {
		return nil, err
	}
	r := bufio.NewReader(conn)
	replies := make([]any, len(cmds))
	for i := range replies {
		if replies[i], err = readReply(r); err != nil {
			return nil, fmt.Errorf("read reply to %s: %w", cmds[i][0], err)
		}
	}
	return replies, nil
}

// readReply reads one RESP2 reply.
func readReply(r *bufio.Reader) (any, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return nil, err
	}
	line = strings.TrimSuffix(line, "\r\n")
	if line == "" {
		return nil, errors.New("empty reply line")
	}
	kind, rest := line[0], line[1:]
	switch kind {
	case '+':
		return rest, nil
	case '-':
		return ReplyError(rest), nil
	case ':':
		return strconv.ParseInt(rest, 10, 64)
	case '$':
		n, err := strconv.Atoi(rest)
		if err != nil || n < -1 {
			return nil, fmt.Errorf("bad bulk length %q", rest)
		}
		if n == -1 {
			return nil, nil
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(r, buf); err != nil {
			return nil, err
		}
		return string(buf[:n]), nil
	case '*':
		n, err := strconv.Atoi(rest)
		if err != nil || n < -1 {
			return nil, fmt.Errorf("bad array length %q", rest)
		}
		if n == -1 {
			return nil, nil
		}
		elems := make([]any, n)
		for i := range elems {
			if elems[i], err = readReply(r); err != nil {
				return nil, err
			}
		}
		return elems, nil
	default:
		return nil, fmt.Errorf("unexpected reply type %q", kind)
	}
}
