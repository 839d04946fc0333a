package redact

import "testing"

func TestRedactURL(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"redis://:pw@host:6379/0":                           "redis://:xxxxx@host:6379/0",
		"redis://user:pw@host:6379":                         "redis://user:xxxxx@host:6379",
		"https://token@host/path?q=a@":                      "https://xxxxx@host/path?q=a@",
		"user:pw@host:6379":                                 "user:xxxxx@host:6379",
		"http://host:9000/a@b":                              "http://host:9000/a@b",
		"host:6379":                                         "host:6379",
		"redis://:p@ss@host:1":                              "redis://:xxxxx@host:1",
		"postgres://u@h/db?password=pw&sslmode=disable":     "postgres://u@h/db?password=xxxxx&sslmode=disable",
		"postgres://u:a@h/db?sslpassword=pw#frag":           "postgres://u:xxxxx@h/db?sslpassword=xxxxx#frag",
		"http://h/?api_key=k&API-TOKEN=t&x=1&secret":        "http://h/?api_key=xxxxx&API-TOKEN=xxxxx&x=1&secret",
		"http://h/?pwd=a;b&client%5Fsecret=c&access_key=":   "http://h/?pwd=xxxxx&client%5Fsecret=xxxxx&access_key=",
		"host:6379?pass=pw":                                 "host:6379?pass=xxxxx",
		"host=h password=pw user=u":                         "host=h password=xxxxx user=u",
		"host=h password = 'p w\\'x' sslkey=/k dbname=d":    "host=h password = 'xxxxx' sslkey=xxxxx dbname=d",
		"http://h/path?q=1":                                 "http://h/path?q=1",
		"postgres:///db?host=/run/pg&password=pw":           "postgres:///db?host=/run/pg&password=xxxxx",
		"redis://h:6379?dial_timeout=1s&password=p%26w&x=y": "redis://h:6379?dial_timeout=1s&password=xxxxx&x=y",
	} {
		if got := URL(in); got != want {
			t.Errorf("URL(%q): got %q, want %q", in, got, want)
		}
	}
}
