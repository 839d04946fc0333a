package redisinfo

import "testing"

func TestParseVersion(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Version
		ok   bool
	}{
		{"7.0.15", Version{7, 0, 15}, true},
		{"6.2.14", Version{6, 2, 14}, true},
		{"7.2.4", Version{7, 2, 4}, true},
		{"8.0.0", Version{8, 0, 0}, true},
		{"255.255.255", Version{255, 255, 255}, true}, // unstable builds
		{"7.0", Version{7, 0, 0}, true},
		{" 7.4.1\r", Version{7, 4, 1}, true},
		{"", Version{}, false},
		{"7", Version{}, false},
		{"7.x.1", Version{}, false},
		{"7.0.1.2", Version{}, false},
		{"-1.0.0", Version{}, false},
	} {
		got, ok := ParseVersion(tc.in)
		if got != tc.want || ok != tc.ok {
			t.Errorf("ParseVersion(%q): got %v, %v, want %v, %v", tc.in, got, ok, tc.want, tc.ok)
		}
	}
}

func TestAtLeast(t *testing.T) {
	for _, tc := range []struct {
		v            Version
		major, minor int
		want         bool
	}{
		{Version{7, 0, 0}, 7, 0, true},
		{Version{6, 2, 14}, 7, 0, false},
		{Version{7, 0, 15}, 7, 2, false},
		{Version{7, 2, 0}, 7, 2, true},
		{Version{8, 0, 0}, 7, 2, true},
		{Version{6, 9, 0}, 7, 0, false},
	} {
		if got := tc.v.AtLeast(tc.major, tc.minor); got != tc.want {
			t.Errorf("%v.AtLeast(%d, %d): got %v, want %v", tc.v, tc.major, tc.minor, got, tc.want)
		}
	}
}

func TestServer(t *testing.T) {
	valkey := Parse("# Server\r\nredis_version:7.2.4\r\nserver_name:valkey\r\nvalkey_version:8.0.1\r\n")
	if name, v := Server(valkey); name != "valkey" || v != "8.0.1" {
		t.Errorf("Server(valkey): got %s %s, want valkey 8.0.1", name, v)
	}
	if v, ok := Compatible(valkey); !ok || v != (Version{7, 2, 4}) {
		t.Errorf("Compatible(valkey): got %v, %v, want 7.2.4", v, ok)
	}
	redis := Parse("# Server\r\nredis_version:8.0.0\r\n\r\n# Memory\r\nmaxmemory_policy:noeviction\r\n")
	if name, v := Server(redis); name != "redis" || v != "8.0.0" {
		t.Errorf("Server(redis): got %s %s, want redis 8.0.0", name, v)
	}
	if got := redis["maxmemory_policy"]; got != "noeviction" {
		t.Errorf("maxmemory_policy: got %q, want noeviction", got)
	}
}

func TestCPU(t *testing.T) {
	for _, tc := range []struct {
		info string
		want float64
		ok   bool
	}{
		{"# CPU\r\nused_cpu_sys:1.5\r\nused_cpu_user:2.5\r\nused_cpu_sys_main_thread:0.25\r\nused_cpu_user_main_thread:1.00\r\n", 1.25, true},
		{"# CPU\r\nused_cpu_sys:1.5\r\nused_cpu_user:2.5\r\n", 4, true},
		{"# Server\r\nredis_version:7.0.15\r\n", 0, false},
	} {
		got, err := CPU(tc.info)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("CPU(%q) = %v, %v; want %v, ok %v", tc.info, got, err, tc.want, tc.ok)
		}
	}
}
