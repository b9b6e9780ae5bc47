package kubernetes_test

// The two image builds produce one layout: the Dockerfile (for people with
// Docker) and ko (.ko.yaml on the base of internal/ociimage, built and run
// in CI by `storaged-image ci`). Both are compared here with
// internal/ociimage's layout: binary path, user, environment, ports, data
// volume, health check, entrypoint, and the build flags of the binary.
// TestImageParityCatchesMutations proves each comparison can fail.

import (
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/storaged/storaged/internal/ociimage"
)

const koConfigPath = "../../.ko.yaml"

// ldflagsArg is go build's -ldflags argument, quoted or not.
var ldflagsArg = regexp.MustCompile(`-ldflags=(?:"([^"]*)"|'([^']*)'|(\S+))`)

// checkImageParity compares the Dockerfile's final stage and build, and
// .ko.yaml, with the layout.
func checkImageParity(dockerfile string, ko ociimage.KoConfig) problems {
	var p problems
	stages := parseDockerfile(dockerfile)
	if len(stages) < 2 {
		p.add("Dockerfile: %d stage(s)", len(stages))
		return p
	}
	final := &stages[len(stages)-1]

	if u := final.last("USER"); u == nil || u.args != ociimage.User {
		p.add("Dockerfile: USER %v, ko's base has %s", u, ociimage.User)
	}
	env := map[string]string{}
	for _, in := range final.all("ENV") {
		maps.Copy(env, envPairs(in.args))
	}
	wantEnv := map[string]string{"PATH": ociimage.ImagePath}
	for _, kv := range ociimage.Env() {
		k, v, _ := strings.Cut(kv, "=")
		wantEnv[k] = v
	}
	if !maps.Equal(env, wantEnv) {
		p.add("Dockerfile: ENV %v, the ko image has %v (besides SSL_CERT_FILE from the base, KO_DATA_PATH from ko)", env, wantEnv)
	}
	var ports []string
	for _, in := range final.all("EXPOSE") {
		for _, port := range strings.Fields(in.args) {
			if !strings.Contains(port, "/") {
				port += "/tcp"
			}
			ports = append(ports, port)
		}
	}
	if want := slices.Sorted(maps.Keys(ociimage.Config().ExposedPorts)); !slices.Equal(slices.Sorted(slices.Values(ports)), want) {
		p.add("Dockerfile: EXPOSE %v, ko's base exposes %v", ports, want)
	}
	var volumes []string
	for _, in := range final.all("VOLUME") {
		if argv, ok := execForm(in.args); ok {
			volumes = append(volumes, argv...)
		} else {
			volumes = append(volumes, strings.Fields(in.args)...)
		}
	}
	if want := slices.Sorted(maps.Keys(ociimage.Config().Volumes)); !slices.Equal(slices.Sorted(slices.Values(volumes)), want) {
		p.add("Dockerfile: VOLUME %v, ko's base has %v", volumes, want)
	}
	if ep := final.last("ENTRYPOINT"); ep == nil {
		p.add("Dockerfile: no ENTRYPOINT")
	} else if argv, _ := execForm(ep.args); !slices.Equal(argv, []string{ociimage.BinaryPath}) {
		p.add("Dockerfile line %d: ENTRYPOINT %v, ko's is [%s]", ep.line, argv, ociimage.BinaryPath)
	}
	if cmd := final.last("CMD"); cmd != nil {
		p.add("Dockerfile line %d: CMD %s; ko clears it", cmd.line, cmd.args)
	}
	p = append(p, checkHealthcheckParity(final)...)

	// COPY: the binary to ko's path, the data dir owned by the user.
	binary, data := false, false
	for _, in := range final.all("COPY") {
		f := strings.Fields(in.args)
		if len(f) == 0 {
			continue
		}
		dest := f[len(f)-1]
		binary = binary || dest == ociimage.BinaryPath
		data = data || (dest == ociimage.DataDir && slices.Contains(f, "--chown="+ociimage.User))
	}
	if !binary {
		p.add("Dockerfile: no COPY of the binary to %s", ociimage.BinaryPath)
	}
	if !data {
		p.add("Dockerfile: no COPY --chown=%s of the data dir to %s", ociimage.User, ociimage.DataDir)
	}

	// The binary: ko's flags and ldflags in the Dockerfile's go build.
	if len(ko.Builds) != 1 {
		p.add(".ko.yaml: %d builds, want 1 (storaged)", len(ko.Builds))
		return p
	}
	b := ko.Builds[0]
	if b.Main != "./cmd/storaged" {
		p.add(".ko.yaml: main %q, want ./cmd/storaged", b.Main)
	}
	if !slices.Contains(b.Env, "CGO_ENABLED=0") {
		p.add(".ko.yaml: env %v lacks CGO_ENABLED=0 (the base has no libc)", b.Env)
	}
	if !slices.ContainsFunc(b.Ldflags, func(s string) bool { return strings.HasPrefix(s, "-X "+buildinfoPkg+".Revision=") }) {
		p.add(".ko.yaml: ldflags %v do not stamp %s.Revision", b.Ldflags, buildinfoPkg)
	}
	goBuild := ""
	for _, st := range stages[:len(stages)-1] {
		for _, in := range st.all("RUN") {
			for _, seg := range shellSeparators.Split(in.args, -1) {
				if strings.Contains(seg, "go build") && strings.Contains(seg, "./cmd/storaged") {
					goBuild = seg
				}
			}
		}
	}
	ldflags := ""
	if m := ldflagsArg.FindStringSubmatch(goBuild); m != nil {
		ldflags = m[1] + m[2] + m[3]
	}
	flags := strings.Fields(ldflagsArg.ReplaceAllString(goBuild, ""))
	for _, f := range append([]string{"-trimpath"}, b.Flags...) { // ko adds -trimpath itself
		switch {
		case strings.HasPrefix(f, "-buildvcs"): // no .git in the Docker build context: build args instead
		case strings.HasPrefix(f, "-tags="):
			if !slices.Contains(flags, f) && !strings.Contains(goBuild, "-tags "+strings.TrimPrefix(f, "-tags=")) {
				p.add("Dockerfile: go build lacks ko's %s", f)
			}
		default:
			if !slices.Contains(flags, f) {
				p.add("Dockerfile: go build lacks ko's %s", f)
			}
		}
	}
	ld := strings.Fields(ldflags)
	for _, f := range b.Ldflags {
		if strings.HasPrefix(f, "-X ") {
			target, _, _ := strings.Cut(strings.TrimPrefix(f, "-X "), "=")
			if !strings.Contains(ldflags, "-X "+target+"=") {
				p.add("Dockerfile: go build -ldflags %q do not set %s like .ko.yaml", ldflags, target)
			}
		} else if !slices.Contains(ld, f) {
			p.add("Dockerfile: go build -ldflags %q lack ko's %s", ldflags, f)
		}
	}
	return p
}

// checkHealthcheckParity: the HEALTHCHECK options and command are the ko
// base's.
func checkHealthcheckParity(final *stage) problems {
	var p problems
	hc := final.last("HEALTHCHECK")
	if hc == nil {
		p.add("Dockerfile: no HEALTHCHECK; ko's base has %v", ociimage.HealthcheckCommand())
		return p
	}
	want := ociimage.Healthcheck()
	f := strings.Fields(hc.args)
	i := 0
	got := map[string]string{}
	for ; i < len(f) && strings.HasPrefix(f[i], "--"); i++ {
		k, v, _ := strings.Cut(strings.TrimPrefix(f[i], "--"), "=")
		got[k] = v
	}
	for k, w := range map[string]time.Duration{"interval": want.Interval, "timeout": want.Timeout, "start-period": want.StartPeriod} {
		if d, err := time.ParseDuration(got[k]); err != nil || d != w {
			p.add("Dockerfile line %d: HEALTHCHECK --%s=%q, ko's base has %v", hc.line, k, got[k], w)
		}
	}
	if got["retries"] != strconv.Itoa(want.Retries) {
		p.add("Dockerfile line %d: HEALTHCHECK --retries=%q, ko's base has %d", hc.line, got["retries"], want.Retries)
	}
	if i >= len(f) || !strings.EqualFold(f[i], "CMD") {
		p.add("Dockerfile line %d: HEALTHCHECK has no CMD", hc.line)
		return p
	}
	if argv, _ := execForm(strings.Join(f[i+1:], " ")); !slices.Equal(argv, ociimage.HealthcheckCommand()) {
		p.add("Dockerfile line %d: HEALTHCHECK CMD %v, ko's base has %v", hc.line, argv, ociimage.HealthcheckCommand())
	}
	return p
}

func readKoConfig(t *testing.T) ociimage.KoConfig {
	t.Helper()
	ko, err := ociimage.ReadKoConfig(koConfigPath)
	if err != nil {
		t.Fatal(err)
	}
	return ko
}

func TestImageParity(t *testing.T) {
	for _, problem := range checkImageParity(readDockerfile(t), readKoConfig(t)) {
		t.Error(problem)
	}
	// The layout agrees with the manifests' facts too.
	if ociimage.DataDir != containerDataDir || ociimage.UID != nonRootID || ociimage.GID != nonRootID ||
		ociimage.GRPCPort != defaultGRPCPort || ociimage.MetricsPort != defaultMetricsPort {
		t.Errorf("internal/ociimage's layout (%s, %d:%d, ports %d/%d) is not the manifests' (%s, %d, ports %d/%d)",
			ociimage.DataDir, ociimage.UID, ociimage.GID, ociimage.GRPCPort, ociimage.MetricsPort,
			containerDataDir, nonRootID, defaultGRPCPort, defaultMetricsPort)
	}
}

func TestImageParityCatchesMutations(t *testing.T) {
	docker, ko := readDockerfile(t), readKoConfig(t)
	if p := checkImageParity(docker, ko); len(p) != 0 {
		t.Fatalf("the repository itself fails: %v", p)
	}
	for _, tc := range []struct {
		name, old, new, want string
	}{
		{"binary elsewhere", "COPY --from=build /out/storaged /ko-app/storaged", "COPY --from=build /out/storaged /usr/local/bin/storaged", "COPY of the binary"},
		{"entrypoint elsewhere", `ENTRYPOINT ["/ko-app/storaged"]`, `ENTRYPOINT ["/usr/local/bin/storaged"]`, "ENTRYPOINT"},
		{"a CMD", `ENTRYPOINT ["/ko-app/storaged"]`, `ENTRYPOINT ["/ko-app/storaged"]` + "\nCMD [\"--log-level=debug\"]", "ko clears it"},
		{"user by name", "USER 65532:65532", "USER 65532", "USER"},
		{"PATH without /ko-app", ":/bin:/ko-app \\", ":/bin \\", "ENV"},
		{"an extra env", "STORAGED_DATA_DIR=/var/lib/storaged", "STORAGED_DATA_DIR=/var/lib/storaged GOMEMLIMIT=1GiB", "ENV"},
		{"a port more", "EXPOSE 9090 9091", "EXPOSE 9090 9091 9092", "EXPOSE"},
		{"a volume more", `VOLUME ["/var/lib/storaged"]`, `VOLUME ["/var/lib/storaged", "/tmp"]`, "VOLUME"},
		{"data dir not chowned", "COPY --from=build --chown=65532:65532 /out/data", "COPY --from=build /out/data", "--chown"},
		{"healthcheck interval", "--interval=10s", "--interval=30s", "--interval"},
		{"healthcheck retries", "--retries=3", "--retries=5", "--retries"},
		{"healthcheck command", `"-timeout=3s"]`, `"-timeout=1s"]`, "HEALTHCHECK CMD"},
		{"no timetzdata", "-trimpath -tags timetzdata", "-trimpath", "-tags=timetzdata"},
		{"no trimpath", "go build -trimpath", "go build", "-trimpath"},
		{"not stripped", `-ldflags="-s -w -X`, `-ldflags="-X`, "lack ko's -s"},
		{"no revision stamp", "-X github.com/storaged/storaged/internal/buildinfo.Revision=${REVISION}", "", "buildinfo.Revision"},
	} {
		t.Run("Dockerfile/"+tc.name, func(t *testing.T) {
			if !strings.Contains(docker, tc.old) {
				t.Fatalf("mutation source %q not in the Dockerfile: update this test", tc.old)
			}
			p := checkImageParity(strings.Replace(docker, tc.old, tc.new, 1), ko)
			if !slices.ContainsFunc(p, func(s string) bool { return strings.Contains(s, tc.want) }) {
				t.Errorf("want a problem containing %q, got %q", tc.want, p)
			}
		})
	}
	for _, tc := range []struct {
		name   string
		mutate func(*ociimage.KoBuild)
		want   string
	}{
		{"other main", func(b *ociimage.KoBuild) { b.Main = "./cmd/storaged-bench" }, "main"},
		{"cgo", func(b *ociimage.KoBuild) { b.Env = nil }, "CGO_ENABLED=0"},
		{"a flag the Dockerfile lacks", func(b *ociimage.KoBuild) { b.Flags = append(b.Flags, "-race") }, "lacks ko's -race"},
		{"other tags", func(b *ociimage.KoBuild) { b.Flags = []string{"-tags=netgo"} }, "-tags=netgo"},
		{"no revision stamp", func(b *ociimage.KoBuild) { b.Ldflags = []string{"-s", "-w"} }, "Revision"},
		{"an ldflag the Dockerfile lacks", func(b *ociimage.KoBuild) { b.Ldflags = append(b.Ldflags, "-linkmode=internal") }, "-linkmode=internal"},
		{"an -X the Dockerfile lacks", func(b *ociimage.KoBuild) { b.Ldflags = append(b.Ldflags, "-X main.extra=1") }, "main.extra"},
	} {
		t.Run(".ko.yaml/"+tc.name, func(t *testing.T) {
			k := readKoConfig(t)
			tc.mutate(&k.Builds[0])
			p := checkImageParity(docker, k)
			if !slices.ContainsFunc(p, func(s string) bool { return strings.Contains(s, tc.want) }) {
				t.Errorf("want a problem containing %q, got %q", tc.want, p)
			}
		})
	}
	k := readKoConfig(t)
	k.Builds = append(k.Builds, k.Builds[0])
	if p := checkImageParity(docker, k); !slices.ContainsFunc(p, func(s string) bool { return strings.Contains(s, "2 builds") }) {
		t.Errorf("two builds: %q", p)
	}
}
