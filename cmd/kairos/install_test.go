package main

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/mod/module"
	"golang.org/x/mod/zip"
)

// TestGoInstallLatest is the README's `go install …/cmd/kairos@latest`, run
// against this tree before any release exists: the module is packed as the
// go command would fetch it (golang.org/x/mod/zip, so nested modules such as
// bench/ and faults/ stay out, as they would from a tag) into a module proxy
// on disk, which answers @latest with a pseudo-version of HEAD. Every other
// module comes from the local module cache, served as a proxy too, and only
// then from the go command's own GOPROXY. What it proves: the published
// module builds on its own go.mod alone (no replace directive, no file
// outside the module, no dependency left out of go.mod), and the installed
// binary knows the version it was installed at.
func TestGoInstallLatest(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the whole command from a packed module: not in -short")
	}
	t.Parallel()
	root := strings.TrimSpace(sh(t, "", nil, "git", "rev-parse", "--show-toplevel"))
	hash := strings.TrimSpace(sh(t, root, nil, "git", "rev-parse", "HEAD"))
	secs, err := strconv.ParseInt(strings.TrimSpace(sh(t, root, nil, "git", "log", "-1", "--format=%ct")), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	const path = "github.com/kairos-es/kairos"
	// The pseudo-version names HEAD's commit at this moment rather than at
	// the commit's time, so that no earlier run's packing, of other files,
	// can be in the module cache under the same version.
	when := time.Now().UTC()
	if c := time.Unix(secs, 0).UTC(); c.After(when) {
		when = c
	}
	v := module.PseudoVersion("", "", when, hash[:12])

	proxy := t.TempDir()
	at := filepath.Join(proxy, path, "@v")
	if err := os.MkdirAll(at, 0o755); err != nil {
		t.Fatal(err)
	}
	var zipped bytes.Buffer
	if err := zip.CreateFromDir(&zipped, module.Version{Path: path, Version: v}, root); err != nil {
		t.Fatalf("packing the module: %v", err)
	}
	gomod, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	info, _ := json.Marshal(map[string]any{"Version": v, "Time": when})
	for name, data := range map[string][]byte{
		"list":      []byte(v + "\n"),
		v + ".info": info,
		v + ".mod":  gomod,
		v + ".zip":  zipped.Bytes(),
	} {
		if err := os.WriteFile(filepath.Join(at, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("packed %s@%s: %d KiB", path, v, zipped.Len()>>10)

	cache := strings.TrimSpace(sh(t, "", nil, "go", "env", "GOMODCACHE"))
	upstream := strings.TrimSpace(sh(t, "", nil, "go", "env", "GOPROXY"))
	bin, work := t.TempDir(), t.TempDir()
	// The packed module lands in the shared module cache (where the
	// dependencies are, at the paths their compiled packages in the build
	// cache were built from); it goes again at cleanup, made writable first
	// as the go command leaves it read-only.
	t.Cleanup(func() {
		extracted := filepath.Join(cache, path+"@"+v)
		_ = filepath.WalkDir(extracted, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				_ = os.Chmod(p, 0o755)
			}
			return nil
		})
		if err := os.RemoveAll(extracted); err != nil {
			t.Errorf("removing the packed module from the module cache: %v", err)
		}
		downloaded, _ := filepath.Glob(filepath.Join(cache, "cache", "download", path, "@v", v+".*"))
		for _, f := range downloaded {
			_ = os.Remove(f)
		}
		list := filepath.Join(cache, "cache", "download", path, "@v", "list")
		if b, err := os.ReadFile(list); err == nil {
			_ = os.WriteFile(list, bytes.ReplaceAll(b, []byte(v+"\n"), nil), 0o644)
		}
	})
	env := []string{
		"GOPROXY=file://" + filepath.ToSlash(proxy) + ",file://" + filepath.ToSlash(filepath.Join(cache, "cache", "download")) + "," + upstream,
		// The pseudo-version is this test's own: no checksum database has
		// heard of it.
		"GOSUMDB=off", "GOFLAGS=", "GOWORK=off", "GOBIN=" + bin, "GOTOOLCHAIN=local",
	}
	began := time.Now()
	sh(t, work, env, "go", "install", path+"/cmd/kairos@latest")
	t.Logf("go install …@latest took %v", time.Since(began).Round(time.Millisecond))
	out := sh(t, work, nil, filepath.Join(bin, "kairos"), "version")
	if !strings.Contains(out, "kairos "+v+" ") {
		t.Errorf("the installed kairos says %q; want it to name %s", strings.TrimSpace(out), v)
	}
}

// sh runs a command in dir (the test's own directory when empty), with env
// added to the test's, and returns its output; it fails t, with the output,
// when the command fails.
func sh(t *testing.T, dir string, env []string, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out.String())
	}
	return out.String()
}
