package docker

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/docker/docker/api/types/image"
	"github.com/docker/docker/client"
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

// ImageSpec says what BuildImage puts in the image.
type ImageSpec struct {
	// Tag names the image; DefaultImage when empty.
	Tag string
	// Busybox is a static busybox binary on the host; /bin/busybox when
	// empty. Every applet it lists becomes a symlink to it.
	Busybox string
	// Bash is a host bash copied in with the shared libraries ldd names,
	// so that Shell scripts run under bash; /bin/bash when empty, "-" to
	// leave bash out (scripts then run under busybox sh).
	Bash string
	// Programs are more host programs (names looked up in PATH, or
	// absolute paths) copied in at their host path with the shared
	// libraries ldd names — make, say, so that `make test` runs in the
	// sandbox without a registry to pull a toolchain image from.
	Programs []string
}

// BuildImage builds a minimal sandbox image offline, from host files only,
// and imports it into the engine cli talks to: static busybox with its
// applet links, optionally bash and its libraries, a non-root user, and a
// /pulse directory that user owns. No registry is contacted. It returns
// the image ID.
func BuildImage(ctx context.Context, cli client.APIClient, spec ImageSpec) (string, error) {
	if spec.Tag == "" {
		spec.Tag = DefaultImage
	}
	var buf bytes.Buffer
	if err := writeRootFS(&buf, spec); err != nil {
		return "", fmt.Errorf("docker: building the root filesystem: %w", err)
	}
	rc, err := cli.ImageImport(ctx, image.ImportSource{Source: &buf, SourceName: "-"}, spec.Tag, image.ImportOptions{
		Message: "pulse sandbox base image",
		Changes: []string{
			"ENV PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin",
			fmt.Sprintf("USER %d:%d", sandboxUID, sandboxGID),
			"WORKDIR /pulse",
			"LABEL pulse.image=1",
		},
	})
	if err != nil {
		return "", fmt.Errorf("docker: importing image %s: %w", spec.Tag, err)
	}
	defer rc.Close()
	body, err := io.ReadAll(rc)
	if err != nil {
		return "", fmt.Errorf("docker: importing image %s: %w", spec.Tag, err)
	}
	if i := bytes.Index(body, []byte(`"errorDetail"`)); i >= 0 {
		return "", fmt.Errorf("docker: importing image %s: %s", spec.Tag, strings.TrimSpace(string(body)))
	}
	insp, err := cli.ImageInspect(ctx, spec.Tag)
	if err != nil {
		return "", fmt.Errorf("docker: inspecting imported image %s: %w", spec.Tag, err)
	}
	return insp.ID, nil
}

// rootfs collects entries by path so that a library reached twice, or an
// applet that names an existing file, is written once.
type rootfs struct {
	entries map[string]*tar.Header
	data    map[string][]byte
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
	r.entries[p] = &tar.Header{Typeflag: tar.TypeDir, Name: p + "/", Mode: mode, Uid: uid, Gid: uid}
}

func (r *rootfs) file(p string, mode int64, data []byte) {
	p = strings.Trim(p, "/")
	r.dir(path.Dir(p), 0o755, 0)
	r.entries[p] = &tar.Header{Typeflag: tar.TypeReg, Name: p, Mode: mode, Size: int64(len(data))}
	r.data[p] = data
}

func (r *rootfs) symlink(p, target string) {
	p = strings.Trim(p, "/")
	if _, ok := r.entries[p]; ok {
		return
	}
	r.dir(path.Dir(p), 0o755, 0)
	r.entries[p] = &tar.Header{Typeflag: tar.TypeSymlink, Name: p, Linkname: target, Mode: 0o777}
}

// hostFile copies a host file into the image at the same path, following
// symlinks on the host (the image gets the real bytes).
func (r *rootfs) hostFile(p string) error {
	data, err := os.ReadFile(p)
	if err != nil {
		return err
	}
	st, err := os.Stat(p)
	if err != nil {
		return err
	}
	r.file(p, int64(st.Mode().Perm()), data)
	return nil
}

func writeRootFS(w io.Writer, spec ImageSpec) error {
	bb := spec.Busybox
	if bb == "" {
		bb = "/bin/busybox"
	}
	r := &rootfs{entries: map[string]*tar.Header{}, data: map[string][]byte{}}
	data, err := os.ReadFile(bb)
	if err != nil {
		return fmt.Errorf("reading busybox: %w", err)
	}
	r.file("bin/busybox", 0o755, data)
	applets, err := busyboxApplets(bb)
	if err != nil {
		return err
	}
	for _, a := range applets {
		if a == "bin/busybox" {
			continue
		}
		r.symlink(a, "/bin/busybox")
	}
	switch spec.Bash {
	case "-":
	default:
		bash := spec.Bash
		if bash == "" {
			bash = "/bin/bash"
		}
		if err := addDynamic(r, bash, "bin/bash"); err != nil {
			return err
		}
	}
	for _, p := range spec.Programs {
		path, err := exec.LookPath(p)
		if err != nil {
			return fmt.Errorf("program %q for the image: %w", p, err)
		}
		if path, err = filepath.EvalSymlinks(path); err != nil {
			return fmt.Errorf("program %q for the image: %w", p, err)
		}
		if err := addDynamic(r, path, strings.TrimPrefix(path, "/")); err != nil {
			return err
		}
	}
	r.file("etc/passwd", 0o644, []byte(fmt.Sprintf("root:x:0:0:root:/root:/bin/sh\n%s:x:%d:%d:pulse sandbox:/tmp:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n", sandboxUser, sandboxUID, sandboxGID)))
	r.file("etc/group", 0o644, []byte(fmt.Sprintf("root:x:0:\n%s:x:%d:\nnogroup:x:65534:\n", sandboxUser, sandboxGID)))
	r.file("etc/nsswitch.conf", 0o644, []byte("passwd: files\ngroup: files\nhosts: files dns\n"))
	r.dir("tmp", 0o1777, 0)
	r.dir("root", 0o700, 0)
	for _, d := range []string{"proc", "sys", "dev", "etc", "usr/local/bin"} {
		r.dir(d, 0o755, 0)
	}
	r.dir("pulse", 0o755, sandboxUID)

	names := make([]string, 0, len(r.entries))
	for n := range r.entries {
		names = append(names, n)
	}
	sort.Strings(names)
	tw := tar.NewWriter(w)
	mtime := time.Unix(0, 0)
	for _, n := range names {
		h := r.entries[n]
		h.ModTime = mtime
		h.Format = tar.FormatPAX
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if h.Typeflag == tar.TypeReg {
			if _, err := tw.Write(r.data[n]); err != nil {
				return err
			}
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

// addDynamic copies a dynamically linked host program to dst and every
// shared object ldd says it needs, at the paths the loader looks for them.
func addDynamic(r *rootfs, prog, dst string) error {
	data, err := os.ReadFile(prog)
	if err != nil {
		return fmt.Errorf("reading %s: %w", prog, err)
	}
	r.file(dst, 0o755, data)
	out, err := exec.Command("ldd", prog).Output()
	if err != nil {
		// A static program has no libraries; ldd says so with an error.
		return nil
	}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
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
			return fmt.Errorf("copying %s for %s: %w", lib, prog, err)
		}
		// The loader also finds libraries through their resolved path.
		if real, err := filepath.EvalSymlinks(lib); err == nil && real != lib {
			if err := r.hostFile(real); err != nil {
				return fmt.Errorf("copying %s for %s: %w", real, prog, err)
			}
		}
	}
	return nil
}
