package nsinit

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
)

// mountStacked mounts the workspace overlay with the pending layers
// between it and the upper directory. The layers go one by one through
// fsconfig's "lowerdir+" (Linux 6.8), so there is no bound from the one
// page a mount(2) option string may fill, and no escaping of paths.
func mountStacked(cfg *Config, dst string) error {
	err := fsmountOverlay(cfg, dst, true)
	if errors.Is(err, unix.EINVAL) {
		err = fsmountOverlay(cfg, dst, false)
	}
	if err != nil {
		return fmt.Errorf("mounting the workspace overlay with %d pending layers: %w", len(cfg.Layers), err)
	}
	return nil
}

func fsmountOverlay(cfg *Config, dst string, userxattr bool) error {
	fd, err := unix.Fsopen("overlay", unix.FSOPEN_CLOEXEC)
	if err != nil {
		return fmt.Errorf("fsopen: %w", err)
	}
	defer unix.Close(fd)
	// The first lower directory given is the topmost.
	for i := len(cfg.Layers) - 1; i >= 0; i-- {
		if err := unix.FsconfigSetString(fd, "lowerdir+", cfg.Layers[i]); err != nil {
			return fmt.Errorf("layer %s: %w", cfg.Layers[i], err)
		}
	}
	if err := unix.FsconfigSetString(fd, "lowerdir+", cfg.Workspace); err != nil {
		return fmt.Errorf("workspace layer: %w", err)
	}
	if err := unix.FsconfigSetString(fd, "upperdir", cfg.Upper); err != nil {
		return err
	}
	if err := unix.FsconfigSetString(fd, "workdir", cfg.Work); err != nil {
		return err
	}
	if userxattr {
		if err := unix.FsconfigSetFlag(fd, "userxattr"); err != nil {
			return err
		}
	}
	if err := unix.FsconfigCreate(fd); err != nil {
		return err
	}
	mfd, err := unix.Fsmount(fd, unix.FSMOUNT_CLOEXEC, unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV)
	if err != nil {
		return fmt.Errorf("fsmount: %w", err)
	}
	defer unix.Close(mfd)
	if err := unix.MoveMount(mfd, "", unix.AT_FDCWD, dst, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("move_mount: %w", err)
	}
	return nil
}
