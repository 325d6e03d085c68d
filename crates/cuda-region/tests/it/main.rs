//! The CUDA region's file shell: creation, the bytes at the Appendix A offsets, refusal of
//! foreign files, and that a handle dropped (a process gone) frees its slot.

mod region_file;
