package sandbox

import (
	"errors"
	"fmt"
	"strings"
)

// WithImage runs commands in the container image ref (name[:tag] or
// name@digest, present in the engine: nothing is pulled). Only the Docker
// backend runs images, so automatic selection then tries Docker alone,
// and naming another backend with WithBackendName is an error. Without
// it, a policy file's image: is used when Docker is chosen, and ignored
// by the other backends; without either, PULSE_DOCKER_IMAGE or
// docker.DefaultImage.
func WithImage(ref string) Option {
	return func(o *options) error {
		ref = strings.TrimSpace(ref)
		if ref == "" {
			return errors.New("sandbox: WithImage: empty image reference")
		}
		o.image = ref
		return nil
	}
}

// dockerImage is the image the Docker backend is to run ("" for its own
// default).
func (o *options) dockerImage() string {
	if o.image != "" {
		return o.image
	}
	if o.policy != nil {
		return o.policy.Image
	}
	return ""
}

// checkImageBackend refuses WithImage together with a backend that runs
// no images.
func (o *options) checkImageBackend() error {
	if o.image == "" {
		return nil
	}
	switch o.backendName {
	case "", "auto", "docker":
		return nil
	}
	return fmt.Errorf("sandbox: an image (%s) runs only on the docker backend, not %s", o.image, o.backendName)
}
