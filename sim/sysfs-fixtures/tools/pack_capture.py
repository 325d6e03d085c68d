#!/usr/bin/env python3
"""Packs a KFD topology capture directory into one text archive.

Usage: pack_capture.py <capture dir> <output file>

Format (read by src/archive.rs): a header line, then per regular file
`=== <relative path> <byte length>\n` followed by exactly that many bytes and a newline.
Files are sorted by path so the archive is reproducible.
"""
import os
import sys

src, out = sys.argv[1], sys.argv[2]
entries = []
for dirpath, _, files in os.walk(src):
    for name in files:
        full = os.path.join(dirpath, name)
        rel = os.path.relpath(full, src)
        if rel == "README.md":
            continue
        with open(full, "rb") as f:
            entries.append((rel, f.read()))
entries.sort()
with open(out, "wb") as f:
    f.write(b"# hami-sysfs-fixtures KFD capture archive v1\n")
    for rel, data in entries:
        f.write(b"=== %s %d\n" % (rel.encode(), len(data)))
        f.write(data)
        f.write(b"\n")
