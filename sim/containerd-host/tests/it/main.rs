//! `hami-containerd-host`'s integration tests, one binary: `lifecycle` (a private
//! containerd started, an image imported, a container run, everything removed on stop).
//! Need root and Debian's `containerd runc buildah busybox-static`; without root each
//! test says so and returns.

mod lifecycle;
