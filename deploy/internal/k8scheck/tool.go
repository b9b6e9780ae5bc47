package k8scheck

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/storaged/storaged/internal/testenv"
)

// toolsModfile pins the deployment tools (helm, kustomize) in their own
// module, away from the service's go.mod, like tools/buf. They are built
// once by the go command (cached in the build cache) and run as binaries.
const toolsModfile = "tools/deploy/go.mod"

// RepoRoot is the repository root: the nearest directory above the working
// directory that holds toolsModfile.
func RepoRoot(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, toolsModfile)); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatalf("no %s above the working directory", toolsModfile)
		}
		dir = parent
	}
}

var toolPaths sync.Map // tool name -> func() (string, error)

// toolPath builds (or finds in the build cache) a tool of toolsModfile
// and returns its binary: `go tool -n` prints the path without running it.
func toolPath(root, name string) (string, error) {
	f, _ := toolPaths.LoadOrStore(name, sync.OnceValues(func() (string, error) {
		cmd := exec.Command("go", "tool", "-n", "-modfile="+toolsModfile, name)
		cmd.Dir = root
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			return "", fmt.Errorf("go tool -n -modfile=%s %s: %w\n%s", toolsModfile, name, err, stderr.String())
		}
		return strings.TrimSpace(string(out)), nil
	}))
	return f.(func() (string, error))()
}

// Tool runs a tool pinned in tools/deploy/go.mod (helm, kustomize) in the
// repository root and returns its standard output. A tool that cannot be
// built (no go command, no module proxy) fails the test when CI=true and
// skips it otherwise, saying why; a tool that runs and fails always fails
// the test, with its stderr.
func Tool(t testing.TB, name string, args ...string) []byte {
	t.Helper()
	out, err := ToolResult(t, name, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// ToolResult is Tool for a run that is expected to fail: the tool's error
// (with its stderr) is returned rather than failing the test.
func ToolResult(t testing.TB, name string, args ...string) ([]byte, error) {
	t.Helper()
	root := RepoRoot(t)
	bin, err := toolPath(root, name)
	if err != nil {
		testenv.Need(t, false, fmt.Sprintf("%s is needed and could not be built: %v", name, err))
	}
	cmd := exec.Command(bin, args...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+t.TempDir(), "HELM_CONFIG_HOME="+t.TempDir(), "HELM_DATA_HOME="+t.TempDir())
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return out, fmt.Errorf("%s %s: %w\n%s", name, strings.Join(args, " "), err, stderr.String())
		}
		t.Fatalf("%s: %v", name, err)
	}
	return out, nil
}
