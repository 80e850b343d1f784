package docker

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/image"
	"github.com/docker/docker/client"
	"github.com/docker/docker/pkg/stdcopy"
)

// DefaultImage is the image the backend runs when neither WithImage nor
// PULSE_DOCKER_IMAGE names another; `pulse image build` builds it.
const DefaultImage = "pulse-sandbox:latest"

// ImageEnv is the environment variable that overrides DefaultImage.
const ImageEnv = "PULSE_DOCKER_IMAGE"

// The sandbox user. Commands never run as root in the container.
const (
	sandboxUID  = 1000
	sandboxGID  = 1000
	sandboxUser = "pulse"
)

// ErrImageProgram reports a program BuildImage was asked for and could
// not bring into the image, or that does not run there; the message says
// which and why.
var ErrImageProgram = errors.New("docker: program cannot be brought into the image")

// ImageSpec says what BuildImage puts in the image.
type ImageSpec struct {
	// Tag names the image; DefaultImage when empty.
	Tag string
	// Busybox is a static busybox binary on the host; /bin/busybox when
	// empty. Every applet it lists becomes a symlink to it.
	Busybox string
	// Bash is a host bash copied in with the shared libraries it needs,
	// so that Shell scripts run under bash; /bin/bash when empty, "-" to
	// leave bash out (scripts then run under busybox sh).
	Bash string
	// Programs are more host programs (names looked up in PATH, or
	// absolute paths). Each comes in as the real program behind any
	// symlink or launcher script, with its shared libraries, its ELF
	// interpreter and its runtime files (toolchain.go), on the image's
	// PATH; the build fails with ErrImageProgram when one cannot be
	// brought or does not run inside the image.
	Programs []string
	// Progress gets one line per step of the build; nil discards them.
	Progress io.Writer
}

// BuildImage builds a sandbox image offline, from host files only, and
// imports it into the engine cli talks to: static busybox with its
// applet links, optionally bash, the programs of spec with what they need
// to run, a non-root user, and a /pulse directory that user owns. No
// registry is contacted. Before the image gets spec.Tag it runs each
// program's check (`PROG --version` or an equivalent) in a container of
// the new image, with no network; an image that fails a check never gets
// the tag. It returns the image ID.
func BuildImage(ctx context.Context, cli client.APIClient, spec ImageSpec) (string, error) {
	if spec.Tag == "" {
		spec.Tag = DefaultImage
	}
	say := func(format string, args ...any) {
		if spec.Progress != nil {
			fmt.Fprintf(spec.Progress, format+"\n", args...)
		}
	}
	r := newRootFS()
	checks, err := planRootFS(ctx, r, spec, say)
	if err != nil {
		return "", err
	}
	files, size := r.stats()
	say("importing %d entries (%.1f MB) into the engine", files, float64(size)/1e6)
	tmpTag := fmt.Sprintf("%s-building-%s", spec.Tag, randomID())
	if !strings.Contains(tagPart(spec.Tag), ":") {
		tmpTag = fmt.Sprintf("%s:building-%s", spec.Tag, randomID())
	}
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(r.write(pw)) }()
	rc, err := cli.ImageImport(ctx, image.ImportSource{Source: pr, SourceName: "-"}, tmpTag, image.ImportOptions{
		Message: "pulse sandbox base image",
		Changes: []string{
			"ENV PATH=" + basePath,
			fmt.Sprintf("USER %d:%d", sandboxUID, sandboxGID),
			"WORKDIR /pulse",
			"LABEL pulse.image=1",
		},
	})
	if err != nil {
		pr.CloseWithError(err)
		return "", fmt.Errorf("docker: importing image %s: %w", spec.Tag, err)
	}
	body, err := io.ReadAll(rc)
	rc.Close()
	pr.CloseWithError(errors.New("import ended"))
	if err != nil {
		return "", fmt.Errorf("docker: importing image %s: %w", spec.Tag, err)
	}
	if i := bytes.Index(body, []byte(`"errorDetail"`)); i >= 0 {
		return "", fmt.Errorf("docker: importing image %s: %s", spec.Tag, strings.TrimSpace(string(body)))
	}
	defer func() {
		rctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = cli.ImageRemove(rctx, tmpTag, image.RemoveOptions{})
	}()
	if err := runChecks(ctx, cli, tmpTag, checks, say); err != nil {
		return "", err
	}
	if err := cli.ImageTag(ctx, tmpTag, spec.Tag); err != nil {
		return "", fmt.Errorf("docker: tagging image %s: %w", spec.Tag, err)
	}
	insp, err := cli.ImageInspect(ctx, spec.Tag)
	if err != nil {
		return "", fmt.Errorf("docker: inspecting imported image %s: %w", spec.Tag, err)
	}
	say("built %s", spec.Tag)
	return insp.ID, nil
}

// tagPart is what follows the last '/' of a reference, where a ':' starts
// the tag (a ':' before it belongs to a registry's port).
func tagPart(ref string) string {
	if i := strings.LastIndexByte(ref, '/'); i >= 0 {
		return ref[i+1:]
	}
	return ref
}

// planRootFS adds everything spec asks for to r and returns the checks to
// run inside the image.
func planRootFS(ctx context.Context, r *rootfs, spec ImageSpec, say func(string, ...any)) ([]imageCheck, error) {
	bb := spec.Busybox
	if bb == "" {
		bb = "/bin/busybox"
	}
	if err := r.hostFileAs(bb, "bin/busybox", 0o755); err != nil {
		return nil, fmt.Errorf("docker: reading busybox: %w", err)
	}
	if interp, _ := elfInterp(bb); interp != "" {
		return nil, fmt.Errorf("%w: busybox %s is dynamically linked (%s); the image needs a static one (Debian: busybox-static)", ErrImageProgram, bb, interp)
	}
	applets, err := busyboxApplets(bb)
	if err != nil {
		return nil, fmt.Errorf("docker: %w", err)
	}
	for _, a := range applets {
		if a != "bin/busybox" {
			r.symlink(a, "/bin/busybox")
		}
	}
	say("busybox %s: %d applets", bb, len(applets))
	checks := []imageCheck{{name: "busybox", args: []string{"/bin/busybox", "true"}}}
	if spec.Bash != "-" {
		bash := spec.Bash
		if bash == "" {
			bash = "/bin/bash"
		}
		if err := r.addDynamic(bash, "bin/bash"); err != nil {
			return nil, fmt.Errorf("%w: bash %s: %v", ErrImageProgram, bash, err)
		}
		checks = append(checks, imageCheck{name: "bash", args: []string{"/bin/bash", "--version"}})
		say("bash %s", bash)
	}
	seen := map[string]bool{}
	for _, p := range spec.Programs {
		if seen[p] {
			continue
		}
		seen[p] = true
		c, err := addProgram(ctx, r, p, say)
		if err != nil {
			return nil, err
		}
		checks = append(checks, c)
	}
	// TLS roots, for commands that reach hosts through the allowlist.
	for _, ca := range []string{"/etc/ssl/certs/ca-certificates.crt"} {
		if _, err := os.Stat(ca); err == nil {
			if err := r.hostFile(ca); err != nil {
				return nil, fmt.Errorf("docker: copying %s: %w", ca, err)
			}
		}
	}
	r.file("etc/passwd", 0o644, []byte(fmt.Sprintf("root:x:0:0:root:/root:/bin/sh\n%s:x:%d:%d:pulse sandbox:/tmp:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n", sandboxUser, sandboxUID, sandboxGID)))
	r.file("etc/group", 0o644, []byte(fmt.Sprintf("root:x:0:\n%s:x:%d:\nnogroup:x:65534:\n", sandboxUser, sandboxGID)))
	r.file("etc/nsswitch.conf", 0o644, []byte("passwd: files\ngroup: files\nhosts: files dns\n"))
	r.dir("tmp", 0o1777, 0)
	// /root stays traversable when a program lives under it (a pyenv
	// toolchain in /root/.pyenv, say): dir keeps the mode it was first
	// given.
	r.dir("root", 0o700, 0)
	for _, d := range []string{"proc", "sys", "dev", "etc", "usr/local/bin"} {
		r.dir(d, 0o755, 0)
	}
	r.dir("pulse", 0o755, sandboxUID)
	return checks, nil
}

// rootfs collects the image's entries by path, so that a library reached
// twice, or an applet that names an existing file, is written once. File
// contents stay on the host until write streams them, so a toolchain of
// hundreds of megabytes is never held in memory.
type rootfs struct {
	entries map[string]*rootEntry
	inodes  map[[2]uint64]string // host (dev, ino) of a regular file → its image path
}

type rootEntry struct {
	hdr  *tar.Header
	src  string // host file the contents come from, or
	data []byte // the contents themselves
}

func newRootFS() *rootfs {
	return &rootfs{entries: map[string]*rootEntry{}, inodes: map[[2]uint64]string{}}
}

func (r *rootfs) dir(p string, mode int64, uid int) {
	p = strings.Trim(p, "/")
	if p == "" || p == "." {
		return
	}
	r.dir(path.Dir(p), 0o755, 0)
	if _, ok := r.entries[p]; ok {
		return
	}
	r.entries[p] = &rootEntry{hdr: &tar.Header{Typeflag: tar.TypeDir, Name: p + "/", Mode: mode, Uid: uid, Gid: uid}}
}

func (r *rootfs) file(p string, mode int64, data []byte) {
	p = strings.Trim(p, "/")
	r.dir(path.Dir(p), 0o755, 0)
	r.entries[p] = &rootEntry{hdr: &tar.Header{Typeflag: tar.TypeReg, Name: p, Mode: mode, Size: int64(len(data))}, data: data}
}

func (r *rootfs) symlink(p, target string) {
	p = strings.Trim(p, "/")
	if _, ok := r.entries[p]; ok {
		return
	}
	r.dir(path.Dir(p), 0o755, 0)
	r.entries[p] = &rootEntry{hdr: &tar.Header{Typeflag: tar.TypeSymlink, Name: p, Linkname: target, Mode: 0o777}}
}

// hostFileAs adds the host file src (symlinks followed: the image gets
// the real bytes) at image path dst; mode 0 keeps the host's. A file
// whose host inode is already in the image becomes a hard link to it.
func (r *rootfs) hostFileAs(src, dst string, mode int64) error {
	st, err := os.Stat(src)
	if err != nil {
		return err
	}
	if !st.Mode().IsRegular() {
		return fmt.Errorf("%s is not a regular file", src)
	}
	dst = strings.Trim(dst, "/")
	if _, ok := r.entries[dst]; ok {
		return nil
	}
	if mode == 0 {
		mode = int64(st.Mode().Perm())
	}
	r.dir(path.Dir(dst), 0o755, 0)
	h := &tar.Header{Typeflag: tar.TypeReg, Name: dst, Mode: mode, Size: st.Size()}
	if sys, ok := st.Sys().(*syscall.Stat_t); ok {
		key := [2]uint64{uint64(sys.Dev), sys.Ino}
		if first, ok := r.inodes[key]; ok && first != dst {
			r.entries[dst] = &rootEntry{hdr: &tar.Header{Typeflag: tar.TypeLink, Name: dst, Linkname: first, Mode: mode}}
			return nil
		}
		r.inodes[key] = dst
	}
	r.entries[dst] = &rootEntry{hdr: h, src: src}
	return nil
}

// hostFile adds the host file p at the same path in the image.
func (r *rootfs) hostFile(p string) error { return r.hostFileAs(p, p, 0) }

// addTree adds the host directory root and everything beneath it at the
// same paths, except what skip (given the path relative to root) says to
// leave out. Symlinks stay symlinks; every ELF object that needs shared
// libraries brings them.
func (r *rootfs) addTree(root string, skip func(rel string, d fs.DirEntry) bool) (int, error) {
	n := 0
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		if rel != "." && skip != nil && skip(rel, d) {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case d.IsDir():
			r.dir(p, int64(info.Mode().Perm()), 0)
			// dir keeps an earlier mode; a tree's own is the host's.
			r.entries[strings.Trim(p, "/")].hdr.Mode = int64(info.Mode().Perm())
		case d.Type()&fs.ModeSymlink != 0:
			t, err := os.Readlink(p)
			if err != nil {
				return err
			}
			r.symlink(p, t)
		case d.Type().IsRegular():
			if err := r.hostFile(p); err != nil {
				return err
			}
			n++
			if info.Mode().Perm()&0o111 != 0 || strings.Contains(d.Name(), ".so") {
				if err := r.addLibs(p); err != nil {
					return err
				}
			}
		}
		return nil
	})
	return n, err
}

// addDynamic copies the host program prog to dst with its ELF
// interpreter and every shared object it needs.
func (r *rootfs) addDynamic(prog, dst string) error {
	if err := r.hostFileAs(prog, dst, 0o755); err != nil {
		return fmt.Errorf("reading %s: %w", prog, err)
	}
	return r.addLibs(prog)
}

// addLibs adds, at their host paths, the ELF interpreter and the shared
// libraries (as ldd resolves them) of the host file p; nothing for a file
// that is not a dynamically linked ELF object.
func (r *rootfs) addLibs(p string) error {
	interp, needed, isELF := elfDeps(p)
	if !isELF || (interp == "" && !needed) {
		return nil
	}
	if interp != "" {
		if err := r.hostFile(interp); err != nil {
			return fmt.Errorf("copying the ELF interpreter %s of %s: %w", interp, p, err)
		}
	}
	out, err := exec.Command("ldd", p).Output()
	if err != nil {
		return fmt.Errorf("ldd %s: %w", p, err)
	}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		line := sc.Text()
		if strings.Contains(line, "not found") {
			return fmt.Errorf("%s needs a library the host lacks: %s", p, strings.TrimSpace(line))
		}
		f := strings.Fields(line)
		var lib string
		switch {
		case len(f) >= 3 && f[1] == "=>" && strings.HasPrefix(f[2], "/"):
			lib = f[2]
		case len(f) >= 1 && strings.HasPrefix(f[0], "/"):
			lib = f[0]
		default:
			continue
		}
		if err := r.hostFile(lib); err != nil {
			return fmt.Errorf("copying %s for %s: %w", lib, p, err)
		}
		// The loader may also reach a library through its resolved path.
		if real, err := filepath.EvalSymlinks(lib); err == nil && real != lib {
			if err := r.hostFile(real); err != nil {
				return fmt.Errorf("copying %s for %s: %w", real, p, err)
			}
		}
	}
	return nil
}

// elfDeps reports whether p is an ELF object, its interpreter, and
// whether it names shared libraries.
func elfDeps(p string) (interp string, needed, isELF bool) {
	f, err := elf.Open(p)
	if err != nil {
		return "", false, false
	}
	defer f.Close()
	for _, prog := range f.Progs {
		if prog.Type == elf.PT_INTERP {
			b, err := io.ReadAll(prog.Open())
			if err == nil {
				interp = strings.TrimRight(string(b), "\x00")
			}
		}
	}
	libs, _ := f.ImportedLibraries()
	return interp, len(libs) > 0, true
}

func elfInterp(p string) (string, bool) {
	interp, _, ok := elfDeps(p)
	return interp, ok
}

func (r *rootfs) stats() (entries int, bytes int64) {
	for _, e := range r.entries {
		bytes += e.hdr.Size
	}
	return len(r.entries), bytes
}

// write streams the root filesystem as a tar, in path order (a directory
// before what it holds, a hard link's target before the link).
func (r *rootfs) write(w io.Writer) error {
	names := make([]string, 0, len(r.entries))
	for n := range r.entries {
		names = append(names, n)
	}
	sort.Strings(names)
	// A hard link must come after its target; targets are first seen,
	// so usually earlier, but not always in path order.
	var links []string
	tw := tar.NewWriter(w)
	mtime := time.Unix(0, 0)
	put := func(n string) error {
		e := r.entries[n]
		h := *e.hdr
		h.ModTime = mtime
		h.Format = tar.FormatPAX
		if err := tw.WriteHeader(&h); err != nil {
			return err
		}
		if h.Typeflag != tar.TypeReg {
			return nil
		}
		if e.src == "" {
			_, err := tw.Write(e.data)
			return err
		}
		f, err := os.Open(e.src)
		if err != nil {
			return err
		}
		defer f.Close()
		c, err := io.Copy(tw, io.LimitReader(f, h.Size))
		if err != nil {
			return fmt.Errorf("copying %s: %w", e.src, err)
		}
		if c != h.Size {
			return fmt.Errorf("%s shrank while being copied", e.src)
		}
		return nil
	}
	for _, n := range names {
		if r.entries[n].hdr.Typeflag == tar.TypeLink {
			links = append(links, n)
			continue
		}
		if err := put(n); err != nil {
			return err
		}
	}
	for _, n := range links {
		if err := put(n); err != nil {
			return err
		}
	}
	return tw.Close()
}

// busyboxApplets asks the host busybox for its applets' install paths.
func busyboxApplets(bb string) ([]string, error) {
	out, err := exec.Command(bb, "--list-full").Output()
	if err != nil {
		return nil, fmt.Errorf("listing busybox applets: %w", err)
	}
	var applets []string
	for _, l := range strings.Split(string(out), "\n") {
		l = strings.TrimSpace(l)
		if l == "" || strings.Contains(l, "..") {
			continue
		}
		applets = append(applets, l)
	}
	if len(applets) == 0 {
		return nil, errors.New("busybox lists no applets")
	}
	return applets, nil
}

// imageCheck is a command that must exit 0 inside the new image.
type imageCheck struct {
	name string
	args []string
}

// runChecks runs every check in one container of ref, without network,
// as the sandbox user, and fails naming the first program whose check
// did not pass, with what it printed.
func runChecks(ctx context.Context, cli client.APIClient, ref string, checks []imageCheck, say func(string, ...any)) error {
	var script strings.Builder
	for i, c := range checks {
		q := make([]string, len(c.args))
		for j, a := range c.args {
			q[j] = shellQuote(a)
		}
		fmt.Fprintf(&script, "printf '\\036%d\\036'; %s </dev/null 2>&1; printf '\\036%d %%s\\036' $?\n", i, strings.Join(q, " "), i)
	}
	created, err := cli.ContainerCreate(ctx, &container.Config{
		Image:           ref,
		User:            fmt.Sprintf("%d:%d", sandboxUID, sandboxGID),
		Cmd:             []string{"/bin/sh", "-c", script.String()},
		Env:             []string{"PATH=" + basePath, "HOME=/tmp", "LANG=C.UTF-8"},
		WorkingDir:      "/tmp",
		NetworkDisabled: true,
		Labels:          map[string]string{"pulse.image-check": "1"},
	}, &container.HostConfig{
		NetworkMode:    "none",
		CapDrop:        []string{"ALL"},
		SecurityOpt:    []string{"no-new-privileges"},
		ReadonlyRootfs: true,
		Tmpfs:          map[string]string{"/tmp": "rw,exec,nosuid,nodev,size=512m"},
	}, nil, nil, "")
	if err != nil {
		return fmt.Errorf("docker: creating the check container: %w", err)
	}
	defer func() {
		rctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = cli.ContainerRemove(rctx, created.ID, container.RemoveOptions{Force: true, RemoveVolumes: true})
	}()
	if err := cli.ContainerStart(ctx, created.ID, container.StartOptions{}); err != nil {
		return fmt.Errorf("docker: starting the check container: %w", err)
	}
	waitC, errC := cli.ContainerWait(ctx, created.ID, container.WaitConditionNotRunning)
	select {
	case <-waitC:
	case err := <-errC:
		return fmt.Errorf("docker: waiting for the check container: %w", err)
	}
	logs, err := cli.ContainerLogs(ctx, created.ID, container.LogsOptions{ShowStdout: true, ShowStderr: true})
	if err != nil {
		return fmt.Errorf("docker: reading the checks' output: %w", err)
	}
	var out bytes.Buffer
	_, err = stdcopy.StdCopy(&out, &out, logs)
	logs.Close()
	if err != nil {
		return fmt.Errorf("docker: reading the checks' output: %w", err)
	}
	s := out.String()
	for i, c := range checks {
		start := fmt.Sprintf("\x1e%d\x1e", i)
		a := strings.Index(s, start)
		b := strings.Index(s, fmt.Sprintf("\x1e%d ", i))
		if a < 0 || b < a {
			return fmt.Errorf("%w: %s: its check `%s` did not run in the image", ErrImageProgram, c.name, strings.Join(c.args, " "))
		}
		printed := strings.TrimSpace(s[a+len(start) : b])
		rest := s[b+len(fmt.Sprintf("\x1e%d ", i)):]
		code, _, _ := strings.Cut(rest, "\x1e")
		if code != "0" {
			return fmt.Errorf("%w: %s does not run inside the image: `%s` exited %s: %s", ErrImageProgram, c.name, strings.Join(c.args, " "), code, printed)
		}
		first, _, _ := strings.Cut(printed, "\n")
		if first == "" {
			first = "ok"
		}
		say("checked %s in the image: %s", c.name, first)
	}
	return nil
}

func shellQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./=:,+") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
