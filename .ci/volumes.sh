# Sourced by .ci/run: mounts two small exFAT volumes (a real file system without hard links,
# as on SD cards and USB sticks) through FUSE on loop devices, for tests/core/files.rs:
#   LEASEQ_TEST_NO_LINK_DIR    a writable exFAT volume (creating a queue there renames under a
#                              create lock instead of linking)
#   LEASEQ_TEST_READ_ONLY_DIR  a read-only exFAT volume holding q.leaseq with one job
# The machine's kernel has no FAT driver of its own; exfat-fuse (Debian's, a FUSE file system)
# reads the images through loop devices, which needs root, /dev/fuse and /dev/loop-control.
# Where any of that is missing, nothing is mounted, the two tests print that they checked
# nothing, and this says so loudly. Everything is undone at exit (an EXIT trap), each piece
# registered as it is made.

VOLUMES_UNDO=()
volumes_undo() {
    local i
    for ((i = ${#VOLUMES_UNDO[@]} - 1; i >= 0; i--)); do
        eval "${VOLUMES_UNDO[$i]}" 2>/dev/null || true
    done
}

mount_test_volumes() {
    export PATH="$PATH:/usr/sbin:/sbin"
    if [ "$(id -u)" -ne 0 ] || [ ! -e /dev/fuse ] || [ ! -e /dev/loop-control ]; then
        echo "WARNING: no exFAT test volumes (needs root, /dev/fuse, loop devices): the" \
            "no-hard-links and read-only volume tests check nothing on this machine" >&2
        return 0
    fi
    if ! command -v mount.exfat-fuse >/dev/null || ! command -v mkfs.exfat >/dev/null; then
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
            exfat-fuse exfatprogs fuse3 >/dev/null
    fi
    trap volumes_undo EXIT
    local base rw_loop ro_loop
    base=$(mktemp -d "${TMPDIR:-/tmp}/leaseq-volumes.XXXXXX")
    # Removed last, and only if both volumes are unmounted (never recurse into a mount).
    VOLUMES_UNDO+=("! mountpoint -q '$base/rw' && ! mountpoint -q '$base/ro' && rm -rf '$base'")
    truncate -s 64M "$base/rw.img" "$base/ro.img"
    mkfs.exfat "$base/rw.img" >/dev/null
    mkfs.exfat "$base/ro.img" >/dev/null
    mkdir -p "$base/rw" "$base/ro"
    if ! rw_loop=$(losetup -f --show "$base/rw.img"); then
        echo "WARNING: no loop device: the exFAT volume tests check nothing" >&2
        return 0
    fi
    VOLUMES_UNDO+=("losetup -d '$rw_loop'")
    if ! ro_loop=$(losetup -f --show "$base/ro.img"); then
        echo "WARNING: no loop device: the exFAT volume tests check nothing" >&2
        return 0
    fi
    VOLUMES_UNDO+=("losetup -d '$ro_loop'")
    if ! mount.exfat-fuse "$rw_loop" "$base/rw"; then
        echo "WARNING: mounting exFAT failed: the exFAT volume tests check nothing" >&2
        return 0
    fi
    VOLUMES_UNDO+=("umount '$base/rw'")
    if ! mount.exfat-fuse "$ro_loop" "$base/ro"; then
        echo "WARNING: mounting exFAT failed: the exFAT volume tests check nothing" >&2
        return 0
    fi
    VOLUMES_UNDO+=("umount '$base/ro'")
    # The read-only volume's queue file, made with the leaseq tool while it is writable.
    cargo run -q -p leaseq-cli -- enqueue "$base/ro/q.leaseq" --data "kept" >/dev/null
    umount "$base/ro"
    mount.exfat-fuse -o ro "$ro_loop" "$base/ro"
    export LEASEQ_TEST_NO_LINK_DIR="$base/rw" LEASEQ_TEST_READ_ONLY_DIR="$base/ro"
    echo "exFAT test volumes: $base/rw (read-write), $base/ro (read-only)"
}
