package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/storaged/storaged/internal/ociimage"
)

// Bounds on the waits for the server in the image; nothing sleeps.
const (
	startTimeout = 90 * time.Second
	stopTimeout  = 60 * time.Second
)

// runCI is `storaged-image ci`; see the package doc.
func runCI(ctx context.Context, out io.Writer, repo string, keep bool) (err error) {
	began := time.Now()
	step := func(what string, since time.Time) {
		fmt.Fprintf(out, "  %-58s %6.1fs\n", what, time.Since(since).Seconds())
	}
	if os.Geteuid() != 0 {
		return errors.New("ci needs root: it unpacks files owned by 65532, chroots and switches to UID 65532")
	}
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		return fmt.Errorf("unshare (util-linux): %w", err)
	}
	chroot, err := exec.LookPath("chroot")
	if err != nil {
		return fmt.Errorf("chroot (coreutils): %w", err)
	}
	if repo, err = filepath.Abs(repo); err != nil {
		return err
	}
	work, err := os.MkdirTemp("", "storaged-image-ci-")
	if err != nil {
		return err
	}
	defer func() {
		if keep {
			fmt.Fprintln(out, "  work directory kept:", work)
		} else if rerr := os.RemoveAll(work); rerr != nil {
			err = errors.Join(err, rerr)
		}
	}()

	// 1. The base, and the digest .ko.yaml pins.
	t := time.Now()
	idx, err := ociimage.Base()
	if err != nil {
		return err
	}
	digest, err := idx.Digest()
	if err != nil {
		return err
	}
	if err := checkPin(filepath.Join(repo, ".ko.yaml"), digest.String()); err != nil {
		return err
	}
	step("base built, equal to the .ko.yaml pin "+digest.String()[:19], t)

	// 2. A loopback registry holding it.
	t = time.Now()
	reg, baseRef, err := ociimage.ServeBase(ctx, "127.0.0.1:0", idx)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, reg.Close()) }()
	step("loopback registry on "+reg.Addr+", base pushed", t)

	// 3. ko build, twice: the tarballs must be byte-identical.
	var tars [2]string
	var sums [2]string
	for i := range tars {
		t = time.Now()
		tars[i] = filepath.Join(work, fmt.Sprintf("storaged-%d.tar", i+1))
		if err := koBuild(ctx, repo, baseRef, tars[i]); err != nil {
			return err
		}
		if sums[i], err = fileSHA256(tars[i]); err != nil {
			return err
		}
		step(fmt.Sprintf("ko build #%d (tarball sha256 %s)", i+1, sums[i][:12]), t)
	}
	if sums[0] != sums[1] {
		return fmt.Errorf("two ko builds of one checkout differ: %s vs %s (kept with -keep)", sums[0], sums[1])
	}
	fmt.Fprintln(out, "  reproducible: the two tarballs are identical")

	// 4. The image's config is the layout both builds share.
	img, err := tarball.ImageFromPath(tars[0], nil)
	if err != nil {
		return err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return err
	}
	if err := checkConfig(cf.Config); err != nil {
		return err
	}
	imgDigest, err := img.Digest()
	if err != nil {
		return err
	}
	size, err := fileSize(tars[0])
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "  image %s, %.1f MB tarball, user %s, entrypoint %v\n", imgDigest, float64(size)/1e6, cf.Config.User, cf.Config.Entrypoint)

	// 5. Unpacked, as a runtime would: owners from the layers.
	t = time.Now()
	rootfs := filepath.Join(work, "rootfs")
	if err := os.Mkdir(rootfs, 0o755); err != nil {
		return err
	}
	if err := ociimage.Unpack(img, rootfs, true); err != nil {
		return err
	}
	// A mount point for the namespace's /proc (a runtime provides one too).
	if err := os.Mkdir(filepath.Join(rootfs, "proc"), 0o555); err != nil {
		return err
	}
	if err := checkOwner(filepath.Join(rootfs, ociimage.DataDir), ociimage.UID, ociimage.GID); err != nil {
		return err
	}
	step("unpacked into "+rootfs, t)
	c := container{unshare: unshare, chroot: chroot, rootfs: rootfs, cfg: cf.Config}

	// 6. The build stamp.
	t = time.Now()
	versionOut, err := c.command(ctx, nil, ociimage.BinaryPath, "--version").CombinedOutput()
	if err != nil {
		return fmt.Errorf("storaged --version in the image: %w\n%s", err, versionOut)
	}
	version, revision, err := parseVersion(string(versionOut))
	if err != nil {
		return err
	}
	if err := checkStamp(ctx, repo, version, revision); err != nil {
		return err
	}
	step("stamped: "+strings.TrimSpace(string(versionOut)), t)

	// 7. The server, from the image's entrypoint and environment, as 65532.
	// Loopback ports chosen by the kernel instead of 9090/9091: CI
	// machines run other servers.
	t = time.Now()
	srv := c.command(ctx, []string{"STORAGED_LISTEN=127.0.0.1:0", "STORAGED_METRICS_LISTEN=127.0.0.1:0", "STORAGED_ADMIN_LISTEN="},
		append(slices.Clone(cf.Config.Entrypoint), cf.Config.Cmd...)...)
	logs, err := startLogged(srv)
	if err != nil {
		return err
	}
	stopped := false
	defer func() {
		if !stopped {
			srv.Process.Kill() // by its pid: the process this command started
			logs.wait()
			srv.Wait()
		}
	}()
	listening, err := logs.waitFor("listening", startTimeout)
	if err != nil {
		return err
	}
	grpcAddr, metricsAddr := listening["grpc"], listening["metrics"]
	if _, err := logs.waitFor("serving", startTimeout); err != nil {
		return err
	}
	if err := checkCredentials(srv.Process.Pid, ociimage.UID, ociimage.GID); err != nil {
		return err
	}
	step("storaged SERVING on "+grpcAddr+" as UID "+strconv.Itoa(ociimage.UID), t)

	// 8. Health: the image's own HEALTHCHECK command (its address swapped
	// for the one in use), and readiness.
	t = time.Now()
	hc := slices.Clone(cf.Config.Healthcheck.Test[1:])
	for i, a := range hc {
		if strings.HasPrefix(a, "-addr=") {
			hc[i] = "-addr=" + grpcAddr
		}
	}
	for _, argv := range [][]string{hc, append(slices.Clone(hc), "-service=storaged.v1.MessageStoreService")} {
		hout, err := c.command(ctx, nil, argv...).CombinedOutput()
		if err != nil || string(hout) != "status: SERVING\n" {
			return fmt.Errorf("%v in the image: %v %q", argv, err, hout)
		}
	}
	step("HEALTHCHECK command and readiness: SERVING", t)

	// 9. The build info on /metrics is the stamp --version printed.
	t = time.Now()
	labels, err := scrapeBuildInfo(ctx, metricsAddr)
	if err != nil {
		return err
	}
	if labels["version"] != version || labels["revision"] != revision {
		return fmt.Errorf("storaged_build_info %v, but --version says %s %s", labels, version, revision)
	}
	step(fmt.Sprintf("storaged_build_info{version=%q}", labels["version"]), t)

	// 10. SIGTERM: a clean drain, exit 0; the data dir holds the store's
	// files, owned by 65532.
	t = time.Now()
	if err := srv.Process.Signal(syscall.SIGTERM); err != nil {
		return err
	}
	stopped = true
	werr := logs.waitExit(srv, stopTimeout)
	if werr != nil {
		return fmt.Errorf("storaged after SIGTERM: %w\n%s", werr, logs.text())
	}
	if err := checkOwner(filepath.Join(rootfs, ociimage.DataDir, "commitlog"), ociimage.UID, ociimage.GID); err != nil {
		return err
	}
	step("SIGTERM: exit 0, commitlog owned by 65532", t)
	fmt.Fprintf(out, "  image check passed in %.1fs\n", time.Since(began).Seconds())
	return nil
}

// koBuild runs the pinned ko (tools/ko/go.mod) on ./cmd/storaged with
// .ko.yaml, the base taken from the loopback registry by the pinned
// digest, and writes a tarball instead of pushing.
func koBuild(ctx context.Context, repo string, base name.Digest, tar string) error {
	cmd := exec.CommandContext(ctx, "go", "tool", "-modfile="+filepath.Join(repo, "tools", "ko", "go.mod"), "ko", "build",
		"--bare", "--push=false", "--tarball="+tar, "--platform=linux/"+runtime.GOARCH, "--sbom=none", "./cmd/storaged")
	cmd.Dir = repo
	env := slices.DeleteFunc(os.Environ(), func(kv string) bool {
		return strings.HasPrefix(kv, "KO_") || strings.HasPrefix(kv, "SOURCE_DATE_EPOCH=")
	})
	// The name in the tarball (docker load tags it storaged:latest); never
	// pushed, and not the registry's random port, so tarballs of one
	// checkout are identical across runs too.
	cmd.Env = append(env, "KO_DOCKER_REPO=storaged", "KO_DEFAULTBASEIMAGE="+base.String())
	var buf bytes.Buffer
	cmd.Stdout, cmd.Stderr = &buf, &buf
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("ko build: %w\n%s", err, buf.String())
	}
	return nil
}

// checkConfig compares the built image's config with the layout.
func checkConfig(got v1.Config) error {
	want := ociimage.Config()
	var problems []string
	if got.User != want.User {
		problems = append(problems, fmt.Sprintf("user %q, want %q", got.User, want.User))
	}
	if !slices.Equal(got.Entrypoint, []string{ociimage.BinaryPath}) || len(got.Cmd) != 0 {
		problems = append(problems, fmt.Sprintf("entrypoint %v cmd %v, want [%s]", got.Entrypoint, got.Cmd, ociimage.BinaryPath))
	}
	for _, kv := range append([]string{"PATH=" + ociimage.ImagePath}, ociimage.Env()...) {
		if !slices.Contains(got.Env, kv) {
			problems = append(problems, fmt.Sprintf("env %v lacks %s", got.Env, kv))
		}
	}
	if !reflect.DeepEqual(got.ExposedPorts, want.ExposedPorts) || !reflect.DeepEqual(got.Volumes, want.Volumes) ||
		!reflect.DeepEqual(got.Healthcheck, want.Healthcheck) {
		problems = append(problems, fmt.Sprintf("ports %v volumes %v healthcheck %+v, want %v %v %+v",
			got.ExposedPorts, got.Volumes, got.Healthcheck, want.ExposedPorts, want.Volumes, want.Healthcheck))
	}
	if len(problems) > 0 {
		return fmt.Errorf("image config: %s", strings.Join(problems, "; "))
	}
	return nil
}

// container runs commands from an unpacked image the way a runtime would,
// minus isolation it does not need here: chroot into rootfs, the image's
// user (chroot --userspec sets the groups too), the image's environment
// only, and a private mount namespace with its own /proc (unshare
// --mount-proc), which goes away with the process. The network is the
// host's.
type container struct {
	unshare, chroot, rootfs string
	cfg                     v1.Config
}

// command runs argv in the container, with env appended to the image's.
// No fork: the process is argv itself, so its pid is the command's.
func (c container) command(ctx context.Context, env []string, argv ...string) *exec.Cmd {
	args := append([]string{"--mount", "--mount-proc=" + filepath.Join(c.rootfs, "proc"),
		c.chroot, "--userspec=" + c.cfg.User, "--groups=", c.rootfs}, argv...)
	cmd := exec.CommandContext(ctx, c.unshare, args...)
	cmd.Env = append(slices.Clone(c.cfg.Env), env...) // later entries win
	return cmd
}

var versionLine = regexp.MustCompile(`^storaged (\S+) \(revision (\S+), (go\S+)\)\n$`)

// parseVersion reads `storaged --version`.
func parseVersion(s string) (version, revision string, err error) {
	m := versionLine.FindStringSubmatch(s)
	if m == nil {
		return "", "", fmt.Errorf("storaged --version printed %q", s)
	}
	return m[1], m[2], nil
}

// checkStamp: the revision is the checkout's (git rev-parse HEAD, plus
// "-modified" with uncommitted changes), and in a plain clone the go
// command stamped a module version. (In a git worktree it cannot: its .git
// is a file the go command does not follow; the version is then "dev" and
// only the revision, from .ko.yaml's ldflags, says which build it is.)
func checkStamp(ctx context.Context, repo, version, revision string) error {
	head, err := exec.CommandContext(ctx, "git", "-C", repo, "rev-parse", "HEAD").Output()
	if err != nil {
		return fmt.Errorf("git rev-parse HEAD: %w", err)
	}
	dirty, err := exec.CommandContext(ctx, "git", "-C", repo, "status", "--porcelain").Output()
	if err != nil {
		return fmt.Errorf("git status: %w", err)
	}
	want := strings.TrimSpace(string(head))
	if len(bytes.TrimSpace(dirty)) > 0 {
		want += "-modified"
	}
	if revision != want {
		return fmt.Errorf("the image says revision %s, the checkout is %s", revision, want)
	}
	if fi, err := os.Stat(filepath.Join(repo, ".git")); err == nil && fi.IsDir() && (version == "dev" || version == "(devel)") {
		return fmt.Errorf("the image says version %q in a git clone: the go command did not stamp it", version)
	}
	return nil
}

// checkOwner fails unless path belongs to uid:gid.
func checkOwner(path string, uid, gid int) error {
	fi, err := os.Stat(path)
	if err != nil {
		return err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok || int(st.Uid) != uid || int(st.Gid) != gid {
		return fmt.Errorf("%s is not owned by %d:%d (%+v)", path, uid, gid, fi.Sys())
	}
	return nil
}

// checkCredentials reads the process's real, effective, saved and fs
// UIDs and GIDs, and its supplementary groups, from /proc.
func checkCredentials(pid, uid, gid int) error {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return err
	}
	u, g := strconv.Itoa(uid), strconv.Itoa(gid)
	want := map[string][]string{"Uid:": {u, u, u, u}, "Gid:": {g, g, g, g}, "Groups:": nil}
	for line := range strings.Lines(string(data)) {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		if w, ok := want[f[0]]; ok {
			if !slices.Equal(f[1:], w) {
				return fmt.Errorf("storaged pid %d runs with %q, want %s %v", pid, strings.TrimSpace(line), f[0], w)
			}
			delete(want, f[0])
		}
	}
	if len(want) > 0 {
		return fmt.Errorf("/proc/%d/status lacks %v", pid, want)
	}
	return nil
}

// scrapeBuildInfo returns the labels of storaged_build_info.
func scrapeBuildInfo(ctx context.Context, addr string) (map[string]string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /metrics: %s", resp.Status)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, err
	}
	mf := mfs["storaged_build_info"]
	if mf == nil || len(mf.GetMetric()) != 1 || mf.GetMetric()[0].GetGauge().GetValue() != 1 {
		return nil, fmt.Errorf("/metrics: storaged_build_info is %v, want one series = 1", mf)
	}
	labels := map[string]string{}
	for _, lp := range mf.GetMetric()[0].GetLabel() {
		labels[lp.GetName()] = lp.GetValue()
	}
	return labels, nil
}

func fileSHA256(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

func fileSize(path string) (int64, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return 0, err
	}
	return fi.Size(), nil
}

// logged is a started process whose stderr (JSON log lines) is read by a
// goroutine: lines on a channel, all text kept for errors.
type logged struct {
	lines chan map[string]string
	done  chan struct{} // closed when stderr is drained
	buf   bytes.Buffer  // written by the reader goroutine until done
}

func startLogged(cmd *exec.Cmd) (*logged, error) {
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	l := &logged{lines: make(chan map[string]string, 1024), done: make(chan struct{})}
	go func() {
		defer close(l.done)
		defer close(l.lines)
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			l.buf.Write(sc.Bytes())
			l.buf.WriteByte('\n')
			var raw map[string]any
			if json.Unmarshal(sc.Bytes(), &raw) != nil {
				continue
			}
			line := map[string]string{}
			for k, v := range raw {
				if s, ok := v.(string); ok {
					line[k] = s
				}
			}
			select {
			case l.lines <- line:
			default: // nobody waits for that many; the text keeps them
			}
		}
	}()
	return l, nil
}

// waitFor returns the first line from now on whose message is msg.
func (l *logged) waitFor(msg string, timeout time.Duration) (map[string]string, error) {
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	for {
		select {
		case line, ok := <-l.lines:
			if !ok {
				<-l.done
				return nil, fmt.Errorf("storaged ended before logging %q:\n%s", msg, l.buf.String())
			}
			if line["message"] == msg {
				return line, nil
			}
		case <-timer.C:
			return nil, fmt.Errorf("storaged logged no %q within %v", msg, timeout)
		}
	}
}

// wait drains stderr after a kill.
func (l *logged) wait() { <-l.done }

// waitExit waits (bounded) for the output to end and the process to exit.
func (l *logged) waitExit(cmd *exec.Cmd, timeout time.Duration) error {
	exited := make(chan error, 1)
	go func() {
		<-l.done // stderr first: Wait closes the pipe
		exited <- cmd.Wait()
	}()
	select {
	case err := <-exited:
		return err
	case <-time.After(timeout):
		cmd.Process.Kill()
		return fmt.Errorf("no exit within %v", timeout)
	}
}

// text is the whole output, once it has ended.
func (l *logged) text() string {
	<-l.done
	return l.buf.String()
}
