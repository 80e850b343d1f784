package nsinit

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"
)

// ScratchMessage is the message on the dial socket (DialFd) that carries
// the scratch filesystem's root to the backend (SCM_RIGHTS), sent before
// the command starts.
const ScratchMessage = "scratch"

// mountScratch mounts the tmpfs that holds what the command writes: its
// size and inode count are the bound the kernel enforces as the command
// writes (ENOSPC past it), so that a command cannot fill the host's disk
// or memory beyond its limits.disk_bytes. The upper and work directories
// move into it, with the whiteouts the backend wrote for the hidden paths,
// and the backend gets a descriptor of its root: this mount exists only
// in the sandbox's mount namespace, and the descriptor keeps it readable
// after the namespace is gone, until the backend has read the overlay.
func mountScratch(cfg *Config) error {
	if cfg.Scratch == "" {
		return nil
	}
	if cfg.ScratchBytes <= 0 || cfg.ScratchInodes <= 0 {
		// tmpfs reads 0 as "no limit".
		return fmt.Errorf("scratch: size %d, inodes %d: want both positive", cfg.ScratchBytes, cfg.ScratchInodes)
	}
	opts := "size=" + strconv.FormatInt(cfg.ScratchBytes, 10) + ",nr_inodes=" + strconv.FormatInt(cfg.ScratchInodes, 10) + ",mode=0700"
	if err := unix.Mount("tmpfs", cfg.Scratch, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
		return fmt.Errorf("mounting the scratch tmpfs (%s): %w", opts, err)
	}
	upper, work := filepath.Join(cfg.Scratch, "upper"), filepath.Join(cfg.Scratch, "work")
	if err := copyUpper(cfg.Upper, upper); err != nil {
		return fmt.Errorf("scratch: %w", err)
	}
	if err := os.Mkdir(work, 0o700); err != nil {
		return fmt.Errorf("scratch: %w", err)
	}
	fd, err := unix.Open(cfg.Scratch, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("scratch: %w", err)
	}
	defer unix.Close(fd)
	if err := unix.Sendmsg(DialFd, []byte(ScratchMessage), unix.UnixRights(fd), nil, 0); err != nil {
		return fmt.Errorf("scratch: handing it to the backend: %w", err)
	}
	cfg.Upper, cfg.Work = upper, work
	return nil
}

// copyUpper copies the upper directory the backend prepared (directories
// and the whiteouts of hidden paths, nothing else) to dst, which must not
// exist; the directories keep their modes.
func copyUpper(src, dst string) error {
	st, err := os.Lstat(src)
	if err != nil {
		return err
	}
	if !st.IsDir() {
		return fmt.Errorf("%s is not a directory", src)
	}
	if err := os.Mkdir(dst, 0o700); err != nil {
		return err
	}
	ents, err := os.ReadDir(src)
	if err != nil {
		return err
	}
	for _, e := range ents {
		s, d := filepath.Join(src, e.Name()), filepath.Join(dst, e.Name())
		info, err := e.Info()
		if err != nil {
			return err
		}
		switch {
		case info.IsDir():
			if err := copyUpper(s, d); err != nil {
				return err
			}
		case info.Mode()&os.ModeCharDevice != 0 && info.Sys().(*syscall.Stat_t).Rdev == 0:
			if err := unix.Mknod(d, unix.S_IFCHR, 0); err != nil {
				return fmt.Errorf("whiteout %s: %w", d, err)
			}
		default:
			return fmt.Errorf("%s: not a directory or a whiteout", s)
		}
	}
	return os.Chmod(dst, st.Mode().Perm())
}
