package docker

import (
	"bytes"
	"context"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"time"
)

// What `pulse image build --with PROG` brings, by kind of program. A
// program found in PATH is often not the program: a symlink, a version
// manager's shim (pyenv, asdf: a shell script), or a thin launcher. The
// toolchains below ask the program itself where its real binary and
// runtime files are, which sees through all of those; anything else is
// the real file behind its symlinks, which must be an ELF program (a
// script would need an interpreter nobody named). Every program is copied
// at its host path, so that compiled-in paths (git's exec-path, an RPATH,
// a GOROOT) hold in the image, and linked from /usr/local/bin, first on
// the image's PATH.

// toolchainTimeout bounds each question asked of a host program.
const toolchainTimeout = 30 * time.Second

// addProgram adds the program name (looked up in PATH, or an absolute
// path) with everything it needs, and returns the check that proves it
// runs in the image.
func addProgram(ctx context.Context, r *rootfs, name string, say func(string, ...any)) (imageCheck, error) {
	found, err := exec.LookPath(name)
	if err != nil {
		return imageCheck{}, fmt.Errorf("%w: %s: not found on this host: %v", ErrImageProgram, name, err)
	}
	base := path.Base(name)
	fail := func(format string, args ...any) (imageCheck, error) {
		return imageCheck{}, fmt.Errorf("%w: %s: %s", ErrImageProgram, name, fmt.Sprintf(format, args...))
	}
	switch {
	case base == "go":
		return addGo(ctx, r, base, found, fail, say)
	case strings.HasPrefix(base, "python"):
		return addPython(ctx, r, base, found, fail, say)
	case base == "node" || base == "nodejs":
		return addNode(ctx, r, base, found, fail, say)
	case base == "git":
		return addGit(ctx, r, base, found, fail, say)
	}
	real, err := realProgram(found)
	if err != nil {
		return fail("%v", err)
	}
	if err := r.addDynamic(real, real); err != nil {
		return fail("%v", err)
	}
	r.symlink("usr/local/bin/"+base, real)
	say("%s: %s", name, describe(found, real))
	return imageCheck{name: name, args: []string{base, "--version"}}, nil
}

type failFunc func(format string, args ...any) (imageCheck, error)

// realProgram resolves symlinks and refuses what is not an ELF program.
func realProgram(p string) (string, error) {
	real, err := filepath.EvalSymlinks(p)
	if err != nil {
		return "", err
	}
	if _, ok := elfInterp(real); ok {
		return real, nil
	}
	if head := firstLine(real); strings.HasPrefix(head, "#!") {
		return "", fmt.Errorf("%s is a launcher script (%s), and pulse does not know how to find the program it starts; pass that program's path to --with", real, head)
	}
	return "", fmt.Errorf("%s is not an ELF program", real)
}

func firstLine(p string) string {
	f, err := os.Open(p)
	if err != nil {
		return ""
	}
	defer f.Close()
	buf := make([]byte, 256)
	n, _ := f.Read(buf)
	line, _, _ := bytes.Cut(buf[:n], []byte("\n"))
	return strings.TrimSpace(string(line))
}

func describe(found, real string) string {
	if found == real {
		return real
	}
	return found + " → " + real
}

// ask runs a host program and returns its trimmed output lines.
func ask(ctx context.Context, prog string, args ...string) ([]string, error) {
	ctx, cancel := context.WithTimeout(ctx, toolchainTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, prog, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("`%s %s` failed: %v: %s", prog, strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	var lines []string
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		lines = append(lines, strings.TrimSpace(l))
	}
	return lines, nil
}

// addGo brings a Go toolchain: its GOROOT (what `go env GOROOT` says,
// through any launcher) without the Go project's own tests, testdata and
// API files, which building and testing a module never reads.
func addGo(ctx context.Context, r *rootfs, base, found string, fail failFunc, say func(string, ...any)) (imageCheck, error) {
	out, err := ask(ctx, found, "env", "GOROOT")
	if err != nil || len(out) != 1 || !filepath.IsAbs(out[0]) {
		return fail("cannot find its GOROOT: %v %q", err, out)
	}
	goroot, err := filepath.EvalSymlinks(out[0])
	if err != nil {
		return fail("GOROOT %s: %v", out[0], err)
	}
	goBin := filepath.Join(goroot, "bin", "go")
	if _, ok := elfInterp(goBin); !ok {
		return fail("GOROOT %s has no bin/go program", goroot)
	}
	n, err := r.addTree(goroot, func(rel string, d fs.DirEntry) bool {
		switch rel {
		case "test", "api", "doc", "misc", ".git":
			return true
		}
		if d.IsDir() {
			return d.Name() == "testdata"
		}
		return strings.HasSuffix(rel, "_test.go")
	})
	if err != nil {
		return fail("copying GOROOT %s: %v", goroot, err)
	}
	for _, tool := range []string{"go", "gofmt"} {
		if _, err := os.Stat(filepath.Join(goroot, "bin", tool)); err == nil {
			r.symlink("usr/local/bin/"+tool, filepath.Join(goroot, "bin", tool))
		}
	}
	say("%s: %s, GOROOT %s (%d files)", base, describe(found, goBin), goroot, n)
	return imageCheck{name: base, args: []string{"go", "version"}}, nil
}

// addPython brings the interpreter python itself names (sys.executable,
// through pyenv and other shims) and its standard library, without its
// tests, site-packages (third-party packages: the sandbox gets them from
// a mirror or the allowlist) and the static library for embedding.
func addPython(ctx context.Context, r *rootfs, base, found string, fail failFunc, say func(string, ...any)) (imageCheck, error) {
	out, err := ask(ctx, found, "-c", `import sys, sysconfig; print(sys.executable); print(sysconfig.get_path("stdlib")); print(sysconfig.get_path("platstdlib"))`)
	if err != nil || len(out) != 3 {
		return fail("cannot ask it where its interpreter and standard library are: %v %q", err, out)
	}
	exe, err := realProgram(out[0])
	if err != nil {
		return fail("its interpreter: %v", err)
	}
	if err := r.addDynamic(exe, exe); err != nil {
		return fail("%v", err)
	}
	n := 0
	for _, lib := range out[1:] {
		lib, err := filepath.EvalSymlinks(lib)
		if err != nil {
			return fail("standard library %s: %v", lib, err)
		}
		if _, ok := r.entries[strings.Trim(lib, "/")]; ok {
			continue
		}
		k, err := r.addTree(lib, func(rel string, d fs.DirEntry) bool {
			switch rel {
			case "test", "site-packages", "dist-packages", "idlelib", "turtledemo":
				return true
			}
			return d.IsDir() && !strings.Contains(rel, "/") && strings.HasPrefix(rel, "config-")
		})
		if err != nil {
			return fail("copying its standard library %s: %v", lib, err)
		}
		n += k
		r.dir(path.Join(lib, "site-packages"), 0o755, 0)
	}
	r.symlink("usr/local/bin/"+base, exe)
	if b := path.Base(exe); b != base {
		r.symlink("usr/local/bin/"+b, exe)
	}
	say("%s: %s, standard library %s (%d files)", base, describe(found, exe), out[1], n)
	return imageCheck{name: base, args: []string{base, "-c", "import json, sys, encodings, os; print(sys.version.split()[0])"}}, nil
}

// addNode brings the node binary node itself names (process.execPath,
// through nvm, asdf and other shims) with its libraries; its core
// modules are inside the binary.
func addNode(ctx context.Context, r *rootfs, base, found string, fail failFunc, say func(string, ...any)) (imageCheck, error) {
	out, err := ask(ctx, found, "-e", "console.log(process.execPath)")
	if err != nil || len(out) != 1 {
		return fail("cannot ask it where its binary is: %v %q", err, out)
	}
	exe, err := realProgram(out[0])
	if err != nil {
		return fail("%v", err)
	}
	if err := r.addDynamic(exe, exe); err != nil {
		return fail("%v", err)
	}
	r.symlink("usr/local/bin/"+base, exe)
	say("%s: %s", base, describe(found, exe))
	return imageCheck{name: base, args: []string{base, "-e", "require('fs'); console.log(process.version)"}}, nil
}

// addGit brings git, its exec-path (the helper programs: git-remote-http,
// the scripted commands) with their libraries, and its templates.
func addGit(ctx context.Context, r *rootfs, base, found string, fail failFunc, say func(string, ...any)) (imageCheck, error) {
	exe, err := realProgram(found)
	if err != nil {
		return fail("%v", err)
	}
	if err := r.addDynamic(exe, exe); err != nil {
		return fail("%v", err)
	}
	out, err := ask(ctx, exe, "--exec-path")
	if err != nil || len(out) != 1 || !filepath.IsAbs(out[0]) {
		return fail("cannot find its exec-path: %v %q", err, out)
	}
	execPath, err := filepath.EvalSymlinks(out[0])
	if err != nil {
		return fail("exec-path %s: %v", out[0], err)
	}
	n, err := r.addTree(execPath, nil)
	if err != nil {
		return fail("copying its exec-path %s: %v", execPath, err)
	}
	// The templates `git init` copies, where git's build puts them
	// beside the exec-path (PREFIX/share/git-core/templates).
	tmpl := filepath.Join(filepath.Dir(filepath.Dir(execPath)), "share", "git-core", "templates")
	if st, err := os.Stat(tmpl); err == nil && st.IsDir() {
		if _, err := r.addTree(tmpl, nil); err != nil {
			return fail("copying its templates %s: %v", tmpl, err)
		}
	}
	r.symlink("usr/local/bin/"+base, exe)
	say("%s: %s, exec-path %s (%d files)", base, describe(found, exe), execPath, n)
	return imageCheck{name: base, args: []string{base, "--version"}}, nil
}
