package kubernetes_test

// Offline checks of the repository's Dockerfile (no Docker engine here): the text is parsed into stages
// and instructions, then checked against the same facts as the Kubernetes manifests.
// TestDockerfileChecksCatchMutations proves that each check can fail.

import (
	"encoding/json"
	"net"
	"os"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

const (
	dockerfilePath = "../../Dockerfile"
	buildinfoPkg   = "github.com/storaged/storaged/internal/buildinfo" // -ldflags -X target of the version stamp
)

type instruction struct {
	line int    // first line of the instruction
	cmd  string // upper-case keyword: FROM, RUN, ...
	args string // rest of the instruction, continuation lines joined with a space
}

type stage struct {
	from   string // image reference of FROM
	instrs []instruction
}

// parseDockerfile splits a Dockerfile into stages. It follows the Dockerfile rules that matter here:
// "\" continues a line, comment lines (also inside a continuation) and blank lines are dropped.
// Instructions before the first FROM (global ARGs) are returned in stage -1, i.e. dropped.
func parseDockerfile(text string) []stage {
	var stages []stage
	var buf []string
	start := 0
	flush := func() {
		if len(buf) == 0 {
			return
		}
		joined := strings.Join(buf, " ")
		buf = nil
		cmd, args, _ := strings.Cut(strings.TrimSpace(joined), " ")
		in := instruction{line: start, cmd: strings.ToUpper(cmd), args: strings.TrimSpace(args)}
		if in.cmd == "FROM" {
			f := strings.Fields(in.args)
			f = slices.DeleteFunc(f, func(s string) bool { return strings.HasPrefix(s, "--") }) // --platform=...
			st := stage{}
			if len(f) > 0 {
				st.from = f[0]
			}
			stages = append(stages, st)
			return
		}
		if len(stages) > 0 {
			stages[len(stages)-1].instrs = append(stages[len(stages)-1].instrs, in)
		}
	}
	for i, raw := range strings.Split(text, "\n") {
		line := strings.TrimRight(raw, " \t\r")
		trimmed := strings.TrimSpace(line)
		if trimmed == "" || strings.HasPrefix(trimmed, "#") {
			continue
		}
		if len(buf) == 0 {
			start = i + 1
		}
		if cont, ok := strings.CutSuffix(line, `\`); ok {
			buf = append(buf, strings.TrimSpace(cont))
			continue
		}
		buf = append(buf, trimmed)
		flush()
	}
	flush()
	return stages
}

func (s *stage) all(cmd string) []instruction {
	var out []instruction
	for _, in := range s.instrs {
		if in.cmd == cmd {
			out = append(out, in)
		}
	}
	return out
}

func (s *stage) last(cmd string) *instruction {
	all := s.all(cmd)
	if len(all) == 0 {
		return nil
	}
	return &all[len(all)-1]
}

// execForm returns the argv of an exec-form (JSON array) command, or false for shell form.
func execForm(args string) ([]string, bool) {
	var argv []string
	if !strings.HasPrefix(strings.TrimSpace(args), "[") || json.Unmarshal([]byte(args), &argv) != nil || len(argv) == 0 {
		return nil, false
	}
	return argv, true
}

// envPairs parses the arguments of one ENV instruction ("K=V K2=V2" or the legacy "K V").
func envPairs(args string) map[string]string {
	env := map[string]string{}
	f := strings.Fields(args)
	if len(f) > 0 && !strings.Contains(f[0], "=") {
		env[f[0]] = strings.TrimSpace(strings.TrimPrefix(args, f[0]))
		return env
	}
	for _, kv := range f {
		k, v, _ := strings.Cut(kv, "=")
		env[k] = strings.Trim(v, `"'`)
	}
	return env
}

var shellSeparators = regexp.MustCompile(`&&|\|\||;`)

func checkDockerfile(text string) problems {
	var p problems
	stages := parseDockerfile(text)
	if len(stages) < 2 {
		p.add("Dockerfile: want a multi-stage build (build stage + runtime stage), got %d stage(s)", len(stages))
		return p
	}
	final := &stages[len(stages)-1]

	// Build: every go build/install runs with CGO_ENABLED=0 (static binaries for a libc-less base).
	builtStoraged := false
	for si := range stages[:len(stages)-1] {
		st := &stages[si]
		env := map[string]string{}
		for _, in := range st.instrs {
			switch in.cmd {
			case "ENV":
				for k, v := range envPairs(in.args) {
					env[k] = v
				}
			case "RUN":
				for _, seg := range shellSeparators.Split(in.args, -1) {
					isBuild, isInstall := strings.Contains(seg, "go build"), strings.Contains(seg, "go install")
					if !isBuild && !isInstall {
						continue
					}
					if env["CGO_ENABLED"] != "0" && !strings.Contains(seg, "CGO_ENABLED=0") {
						p.add("Dockerfile line %d: %q runs without CGO_ENABLED=0", in.line, strings.TrimSpace(seg))
					}
					if isBuild && strings.Contains(seg, "./cmd/storaged") {
						builtStoraged = true
						if !strings.Contains(seg, "-trimpath") {
							p.add("Dockerfile line %d: go build of ./cmd/storaged without -trimpath", in.line)
						}
						if !strings.Contains(seg, "-X "+buildinfoPkg+".Version=") {
							p.add("Dockerfile line %d: go build of ./cmd/storaged without -ldflags -X %s.Version=", in.line, buildinfoPkg)
						}
					}
				}
			}
		}
	}
	if !builtStoraged {
		p.add("Dockerfile: no build stage runs go build of ./cmd/storaged")
	}

	// Runtime stage.
	if !strings.HasPrefix(final.from, "gcr.io/distroless/static") {
		p.add("Dockerfile: final stage FROM %q, want gcr.io/distroless/static-*", final.from)
	}
	if u := final.last("USER"); u == nil {
		p.add("Dockerfile: final stage has no USER (would run as root)")
	} else {
		user, _, _ := strings.Cut(u.args, ":")
		uid, err := strconv.Atoi(user)
		switch {
		case user == "root" || (err == nil && uid == 0):
			p.add("Dockerfile line %d: USER %s is root, want a non-root user", u.line, u.args)
		case err != nil:
			p.add("Dockerfile line %d: USER %s is not numeric (Kubernetes runAsNonRoot cannot verify a name)", u.line, u.args)
		case uid != nonRootID:
			p.add("Dockerfile line %d: USER %s, want %d (pod runAsUser/fsGroup)", u.line, u.args, nonRootID)
		}
	}
	var exposed []string
	for _, in := range final.all("EXPOSE") {
		for _, port := range strings.Fields(in.args) {
			exposed = append(exposed, strings.TrimSuffix(port, "/tcp"))
		}
	}
	for _, want := range []int{defaultGRPCPort, defaultMetricsPort} {
		if !slices.Contains(exposed, strconv.Itoa(want)) {
			p.add("Dockerfile: final stage EXPOSE %v does not list %d", exposed, want)
		}
	}
	var volumes []string
	for _, in := range final.all("VOLUME") {
		if argv, ok := execForm(in.args); ok {
			volumes = append(volumes, argv...)
		} else {
			volumes = append(volumes, strings.Fields(in.args)...)
		}
	}
	if !slices.Contains(volumes, containerDataDir) {
		p.add("Dockerfile: final stage VOLUME %v does not list the data dir %s", volumes, containerDataDir)
	}
	env := map[string]string{}
	for _, in := range final.all("ENV") {
		for k, v := range envPairs(in.args) {
			env[k] = v
		}
	}
	if env["STORAGED_DATA_DIR"] != containerDataDir {
		p.add("Dockerfile: final stage ENV STORAGED_DATA_DIR=%q, want %q", env["STORAGED_DATA_DIR"], containerDataDir)
	}
	for name, want := range map[string]int{"STORAGED_LISTEN": defaultGRPCPort, "STORAGED_METRICS_LISTEN": defaultMetricsPort} {
		if v, ok := env[name]; ok {
			if _, port, err := net.SplitHostPort(v); err != nil || port != strconv.Itoa(want) {
				p.add("Dockerfile: ENV %s=%q, want port %d", name, v, want)
			}
		}
	}

	// HEALTHCHECK: exec form, `storaged health` on the gRPC port, overall health ("") = liveness.
	if hc := final.last("HEALTHCHECK"); hc == nil {
		p.add("Dockerfile: final stage has no HEALTHCHECK")
	} else {
		f := strings.Fields(hc.args)
		i := 0
		for i < len(f) && strings.HasPrefix(f[i], "--") {
			i++
		}
		if i >= len(f) || !strings.EqualFold(f[i], "CMD") {
			p.add("Dockerfile line %d: HEALTHCHECK has no CMD", hc.line)
		} else if argv, ok := execForm(strings.Join(f[i+1:], " ")); !ok {
			p.add("Dockerfile line %d: HEALTHCHECK CMD must be exec form (JSON array): the image has no shell", hc.line)
		} else {
			if path.Base(argv[0]) != "storaged" || len(argv) < 2 || argv[1] != "health" {
				p.add("Dockerfile line %d: HEALTHCHECK runs %v, want storaged health", hc.line, argv)
			}
			addrOK := false
			for _, a := range argv[1:] {
				flag, val, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
				switch flag {
				case "service":
					p.add("Dockerfile line %d: HEALTHCHECK passes %s: liveness uses the overall (\"\") health", hc.line, a)
				case "addr":
					_, port, err := net.SplitHostPort(val)
					addrOK = err == nil && port == strconv.Itoa(defaultGRPCPort)
				}
			}
			if !addrOK {
				p.add("Dockerfile line %d: HEALTHCHECK needs -addr=HOST:%d", hc.line, defaultGRPCPort)
			}
		}
	}

	// ENTRYPOINT: exec form, so storaged is PID 1 and receives SIGTERM itself.
	if ep := final.last("ENTRYPOINT"); ep == nil {
		p.add("Dockerfile: final stage has no ENTRYPOINT")
	} else if argv, ok := execForm(ep.args); !ok {
		p.add("Dockerfile line %d: ENTRYPOINT must be exec form (JSON array)", ep.line)
	} else if path.Base(argv[0]) != "storaged" {
		p.add("Dockerfile line %d: ENTRYPOINT runs %s, want storaged", ep.line, argv[0])
	}
	return p
}

func readDockerfile(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile(dockerfilePath)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

func TestDockerfile(t *testing.T) {
	for _, problem := range checkDockerfile(readDockerfile(t)) {
		t.Error(problem)
	}
}

func TestParseDockerfile(t *testing.T) {
	stages := parseDockerfile("# syntax=docker/dockerfile:1\nARG X=1\nFROM --platform=$BUILDPLATFORM a AS b\nRUN one \\\n  # comment inside\n\n  two\nFROM c\nuser 1\n")
	if len(stages) != 2 || stages[0].from != "a" || stages[1].from != "c" {
		t.Fatalf("stages = %+v", stages)
	}
	if got := stages[0].instrs; len(got) != 1 || got[0].cmd != "RUN" || got[0].args != "one two" || got[0].line != 4 {
		t.Errorf("build stage = %+v", got)
	}
	if u := stages[1].last("USER"); u == nil || u.args != "1" {
		t.Errorf("USER = %+v", u)
	}
}

// TestDockerfileChecksCatchMutations proves that each check fails on a Dockerfile that breaks it.
func TestDockerfileChecksCatchMutations(t *testing.T) {
	base := readDockerfile(t)
	if p := checkDockerfile(base); len(p) != 0 {
		t.Fatalf("the Dockerfile itself fails: %v", p)
	}
	const (
		user   = "USER 65532:65532\n"
		expose = "EXPOSE 9090 9091\n"
		volume = `VOLUME ["/var/lib/storaged"]` + "\n"
		hcCmd  = `CMD ["/ko-app/storaged", "health", "-addr=127.0.0.1:9090", "-timeout=3s"]`
		entry  = `ENTRYPOINT ["/ko-app/storaged"]`
		cgo    = "ENV CGO_ENABLED=0\n"
	)
	for _, tc := range []struct {
		name, old, new, want string
	}{
		{"USER root", user, "USER root\n", "is root"},
		{"USER 0", user, "USER 0:0\n", "is root"},
		{"USER by name", user, "USER nonroot:nonroot\n", "not numeric"},
		{"USER other uid", user, "USER 1000\n", "want 65532"},
		{"no USER", user, "", "no USER"},
		{"USER only in build stage", user, "", "no USER"}, // see the build-stage insert below
		{"EXPOSE without metrics", expose, "EXPOSE 9090\n", "does not list 9091"},
		{"EXPOSE wrong grpc", expose, "EXPOSE 8080/tcp 9091/tcp\n", "does not list 9090"},
		{"no VOLUME", volume, "", "VOLUME"},
		{"VOLUME elsewhere", volume, "VOLUME /data\n", "does not list the data dir"},
		{"data dir env", "STORAGED_DATA_DIR=/var/lib/storaged", "STORAGED_DATA_DIR=/data", "STORAGED_DATA_DIR"},
		{"listen env port", "STORAGED_LISTEN=:9090", "STORAGED_LISTEN=:8080", "STORAGED_LISTEN"},
		{"HEALTHCHECK shell form", hcCmd, "CMD /ko-app/storaged health -addr=127.0.0.1:9090", "exec form"},
		{"HEALTHCHECK NONE", "HEALTHCHECK --interval", "HEALTHCHECK NONE\n#", "no CMD"},
		{"HEALTHCHECK readiness", `"-addr=127.0.0.1:9090"`, `"-addr=127.0.0.1:9090", "-service=storaged.v1.MessageStoreService"`, "overall"},
		{"HEALTHCHECK metrics port", "-addr=127.0.0.1:9090", "-addr=127.0.0.1:9091", "-addr=HOST:9090"},
		{"HEALTHCHECK other binary", `"/ko-app/storaged", "health"`, `"/bin/true", "health"`, "want storaged health"},
		{"HEALTHCHECK not the health command", `"/ko-app/storaged", "health"`, `"/ko-app/storaged", "check"`, "want storaged health"},
		{"ENTRYPOINT shell form", entry, "ENTRYPOINT /usr/local/bin/storaged", "ENTRYPOINT must be exec form"},
		{"ENTRYPOINT other binary", entry, `ENTRYPOINT ["/usr/local/bin/grpc-health-probe"]`, "want storaged"},
		{"cgo not disabled", cgo, "", "without CGO_ENABLED=0"},
		{"cgo enabled", cgo, "ENV CGO_ENABLED=1\n", "without CGO_ENABLED=0"},
		{"no trimpath", "go build -trimpath", "go build", "-trimpath"},
		{"no version ldflag", "-X github.com/storaged/storaged/internal/buildinfo.Version=${VERSION}", "", "buildinfo.Version"},
		{"version ldflag to a gone variable", "-X github.com/storaged/storaged/internal/buildinfo.Version=", "-X main.version=", "buildinfo.Version"},
		{"builds something else", "-o /out/storaged ./cmd/storaged", "-o /out/storaged ./cmd/other", "go build of ./cmd/storaged"},
		{"runtime base with libc", "FROM gcr.io/distroless/static-debian12:nonroot", "FROM debian:bookworm-slim", "distroless"},
		{"single stage", "", "", "multi-stage"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var text string
			switch tc.name {
			case "single stage":
				text = "FROM gcr.io/distroless/static-debian12:nonroot\nUSER 65532\n"
			default:
				if !strings.Contains(base, tc.old) {
					t.Fatalf("mutation source %q not in the Dockerfile: update this test", tc.old)
				}
				text = strings.Replace(base, tc.old, tc.new, 1)
				if tc.name == "USER only in build stage" {
					text = strings.Replace(text, "WORKDIR /src\n", "WORKDIR /src\n"+user, 1)
				}
			}
			p := checkDockerfile(text)
			if !slices.ContainsFunc(p, func(s string) bool { return strings.Contains(s, tc.want) }) {
				t.Errorf("want a problem containing %q, got %q", tc.want, p)
			}
		})
	}
}
