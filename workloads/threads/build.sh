#!/usr/bin/env bash
# Builds the multi-threaded workloads (workloads/threads/README.md):
#   target/workloads/threads/<name>.wasm    shared env.memory, wasi.thread-spawn
# The Rust programs with cargo for the Rust target wasm32-wasip1-threads; the
# C programs (c/) with clang-16 for wasm32-wasi-threads against a threads
# sysroot assembled under target/wasi-libc-threads/ (see "sysroot" below).
# Usage: workloads/threads/build.sh [name...]   (default: all). Runs from any
# directory. An output identical to the fresh build (Rust) or newer than all
# its inputs (C) is left alone. A missing tool for the C programs skips them
# with a warning, except under CI=true, where it is an error.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
SRC="$ROOT/workloads/threads"
SELF="$SRC/build.sh"
OUT="$ROOT/target/workloads/threads"
CARGO_OUT="$ROOT/target/workloads-threads-cargo"
TARGET=wasm32-wasip1-threads
RUST_PROGRAMS=(threads-sum threads-rayon threads-omp threads-kv)
C_PROGRAMS=(threads-pthreads threads-zstd)
PROGRAMS=("${RUST_PROGRAMS[@]}" "${C_PROGRAMS[@]}")

# The C side. clang-16 knows the triple wasm32-wasi-threads (the name
# wasm32-wasip1-threads came with LLVM 19); it looks for headers and
# libraries under <sysroot>/{include,lib}/wasm32-wasi-threads.
CLANG="${CLANG:-clang-16}"
C_TRIPLE=wasm32-wasi-threads
LOCK="$SRC/sources.lock"
REAL_LOCK="$ROOT/workloads/real/sources.lock"
# Downloads are cached by hash; the directory is shared with
# workloads/real/build.sh so that the zstd archive is fetched once.
DL="$ROOT/target/real-src/dl"
C_SRC="$ROOT/target/threads-src"
SYSROOT="$ROOT/target/wasi-libc-threads"
C_BUILD="$ROOT/target/threads-c-build"
C_CFLAGS=(--target="$C_TRIPLE" --sysroot="$SYSROOT" -pthread -O2)
# The module imports its memory (shared, as wasi-threads requires: every
# thread instance gets the same one) and exports it, like rustc's output for
# wasm32-wasip1-threads, with the same 1 GiB maximum. The main thread's
# stack is 1 MiB as in the other C workloads; threads' stacks come from
# pthread_create (musl's default size, malloc'ed). --strip-debug: the Rust
# target's libc.a carries DWARF (about 230 KB in every module); the name
# section stays, as in rustc's release output. No -O at link time: clang
# would then run wasm-opt when binaryen happens to be installed, and the
# module would depend on that.
C_LDFLAGS=(--target="$C_TRIPLE" --sysroot="$SYSROOT" -pthread
    -Wl,--import-memory,--export-memory,--shared-memory,--max-memory=1073741824
    -Wl,-z,stack-size=1048576 -Wl,--strip-debug)

die() { echo "threads/build.sh: error: $*" >&2; exit 1; }
warn() { echo "threads/build.sh: warning: $*" >&2; }
have() { command -v "$1" >/dev/null; }

# missing WHAT HINT: a prerequisite of the C programs is absent. Under CI
# that fails the build; otherwise it warns and the C programs are skipped.
missing() {
    if [[ ${CI:-} == true ]]; then die "$1 is missing: $2"; fi
    warn "$1 is missing, skipping the C programs: $2"
}

want_rust=() want_c=()
if [[ $# -eq 0 ]]; then
    want_rust=("${RUST_PROGRAMS[@]}")
    want_c=("${C_PROGRAMS[@]}")
else
    for name in "$@"; do
        if [[ " ${RUST_PROGRAMS[*]} " == *" $name "* ]]; then want_rust+=("$name")
        elif [[ " ${C_PROGRAMS[*]} " == *" $name "* ]]; then want_c+=("$name")
        else die "unknown workload '$name' (known: ${PROGRAMS[*]})"; fi
    done
fi

have cargo || die "cargo not found: install Rust with rustup (https://rustup.rs)"
# rustc, like cargo below, runs here so that rust-toolchain.toml picks the
# toolchain. The C programs need the target too: their libc comes from it.
cd "$SRC"
rust_target="$(rustc --print sysroot)/lib/rustlib/$TARGET"
[[ -d $rust_target ]] ||
    die "the Rust target $TARGET is not installed: run 'rustup target add $TARGET'"
mkdir -p "$OUT"

# ---- Rust programs -----------------------------------------------------------
if [[ ${#want_rust[@]} -gt 0 ]]; then
    pkgs=()
    for name in "${want_rust[@]}"; do pkgs+=(-p "$name"); done
    CARGO_TARGET_DIR="$CARGO_OUT" cargo build --quiet --release --target "$TARGET" --locked "${pkgs[@]}"
    for name in "${want_rust[@]}"; do
        built="$CARGO_OUT/$TARGET/release/$name.wasm"
        if [[ -e $OUT/$name.wasm ]] && cmp -s "$built" "$OUT/$name.wasm"; then
            echo "up to date  target/workloads/threads/$name.wasm"
        else
            cp "$built" "$OUT/$name.wasm"
            echo "built       target/workloads/threads/$name.wasm"
        fi
    done
fi
[[ ${#want_c[@]} -gt 0 ]] || exit 0

# ---- C programs: downloads -----------------------------------------------------

# download LOCKFILE NAME: fetch (cached by hash) and verify the file that
# LOCKFILE pins for NAME; sets $ARCHIVE to it, $VERSION and $SHA.
download() {
    local lock=$1 name=$2 line url tmp got
    line="$(awk -v n="$name" '$1 == n && NF == 4 { print; exit }' "$lock")"
    [[ -n $line ]] || die "no entry for '$name' in $lock"
    read -r _ VERSION SHA url <<<"$line"
    mkdir -p "$DL"
    ARCHIVE="$DL/$SHA-${url##*/}"
    [[ -e $ARCHIVE ]] && return 0
    echo "download    $url"
    tmp="$ARCHIVE.part"
    curl -fsSL --retry 3 --connect-timeout 30 -o "$tmp" "$url" || die "download of $url failed"
    got="$(sha256sum "$tmp" | cut -d' ' -f1)"
    if [[ $got != "$SHA" ]]; then
        rm -f "$tmp"
        die "sha256 mismatch for $url: expected $SHA ($lock), got $got"
    fi
    mv "$tmp" "$ARCHIVE"
}

# verified: the cache could have been tampered with or truncated since.
verified() {
    [[ $(sha256sum "$ARCHIVE" | cut -d' ' -f1) == "$SHA" ]] || die "cached $ARCHIVE does not match its lock file; delete it"
}

# unpack LOCKFILE NAME: download NAME and unpack it (once per hash) under
# target/threads-src/; sets $DIR to the tree.
unpack() {
    download "$1" "$2"
    DIR="$C_SRC/$2-$VERSION"
    if [[ ! -e $DIR/.roam-unpacked ]] || [[ $(cat "$DIR/.roam-unpacked") != "$SHA" ]]; then
        verified
        rm -rf "$DIR"
        mkdir -p "$DIR"
        tar -xf "$ARCHIVE" -C "$DIR" --strip-components=1
        echo "$SHA" >"$DIR/.roam-unpacked"
    fi
}

# ---- C programs: the sysroot ---------------------------------------------------
# Debian bookworm's wasi-libc (2022) has only the single thread model: its
# objects lack atomics, so wasm-ld refuses them with --shared-memory, and
# its pthread_create is a stub. A threads sysroot is assembled instead:
#   include/  wasi-libc's headers, from Debian trixie's wasi-libc package
#             (sources.lock). wasi-libc installs the same header set for
#             both thread models (scripts/install-include-headers.sh).
#   lib/      libc.a and crt1-command.o of the Rust target
#             wasm32-wasip1-threads: wasi-libc built by the Rust project
#             with THREAD_MODEL=posix (pthreads, wasi_thread_start), pinned
#             by rust-toolchain.toml like the Rust programs' own libc.
#             libpthread.a and libm.a are empty placeholders, as in
#             wasi-libc's own sysroot (both live in libc.a); clang -pthread
#             asks for -lpthread.
# compiler-rt's builtins come from Debian's libclang-rt-16-dev-wasm32, where
# clang-16 finds them by itself. Rebuilt when the package's hash, the Rust
# libc or this script changes.
RUST_LIBC="$rust_target/lib/self-contained"
sysroot() {
    local lib=$RUST_LIBC key tmp
    download "$LOCK" wasi-libc
    key="$SHA $(cat "$lib/libc.a" "$lib/crt1-command.o" "$SELF" | sha256sum | cut -d' ' -f1)"
    if [[ -e $SYSROOT/.roam-key ]] && [[ $(cat "$SYSROOT/.roam-key") == "$key" ]]; then return 0; fi
    verified
    echo "assemble    target/wasi-libc-threads (wasi-libc $VERSION headers, Rust's $TARGET libc)"
    rm -rf "$SYSROOT"
    tmp="$(mktemp -d)"
    dpkg-deb -x "$ARCHIVE" "$tmp"
    [[ -e $tmp/usr/include/wasm32-wasi/pthread.h ]] || { rm -rf "$tmp"; die "$ARCHIVE has no usr/include/wasm32-wasi/pthread.h"; }
    mkdir -p "$SYSROOT/include" "$SYSROOT/lib/$C_TRIPLE"
    mv "$tmp/usr/include/wasm32-wasi" "$SYSROOT/include/$C_TRIPLE"
    rm -rf "$tmp"
    cp "$lib/libc.a" "$lib/crt1-command.o" "$SYSROOT/lib/$C_TRIPLE/"
    # An empty ar archive is just its magic line; no llvm-ar needed.
    printf '!<arch>\n' >"$SYSROOT/lib/$C_TRIPLE/libpthread.a"
    printf '!<arch>\n' >"$SYSROOT/lib/$C_TRIPLE/libm.a"
    echo "$key" >"$SYSROOT/.roam-key"
}

# c_tools: every tool the C programs need. Returns 1 (after missing) when
# one is absent. Kept apart from sysroot, which must run outside an ||
# list: there set -e would not stop it at a failing command.
c_tools() {
    local tool
    for tool in "$CLANG:the Debian packages clang-16 lld-16" "curl:the Debian package curl" \
        "dpkg-deb:the Debian package dpkg" "tar:the Debian package tar" "xz:the Debian package xz-utils"; do
        have "${tool%%:*}" || { missing "${tool%%:*}" "install ${tool#*:}"; return 1; }
    done
    [[ -e $RUST_LIBC/libc.a && -e $RUST_LIBC/crt1-command.o ]] ||
        { missing "wasi-libc of the Rust target $TARGET" "no $RUST_LIBC/libc.a; run 'rustup target add $TARGET'"; return 1; }
}

# c_probe: links a thread against the sysroot, so that a broken toolchain
# (no wasm-ld, no compiler-rt for wasm32) is reported as such.
c_probe() {
    local probe
    probe="$(mktemp -d)"
    printf '%s\n' '#include <pthread.h>' 'static void *f(void *p) { return p; }' \
        'int main(void) { pthread_t t; void *r; pthread_create(&t, 0, f, &t); pthread_join(t, &r); return r != &t; }' >"$probe/p.c"
    if ! "$CLANG" "${C_CFLAGS[@]}" -c "$probe/p.c" -o "$probe/p.o" 2>"$probe/err" ||
        ! "$CLANG" "${C_LDFLAGS[@]}" "$probe/p.o" -o "$probe/p.wasm" 2>>"$probe/err"; then
        cat "$probe/err" >&2
        rm -rf "$probe"
        missing "a $C_TRIPLE C toolchain" "install the Debian packages clang-16 lld-16 libclang-rt-16-dev-wasm32"
        return 1
    fi
    rm -rf "$probe"
}

# c_build NAME SOURCES... -- CFLAGS...: compiles each source to its own
# object (clang -c, in one invocation per call) and links them.
c_build() {
    local name=$1 objs="$C_BUILD/$1" srcs=() flags=()
    shift
    while [[ $1 != -- ]]; do srcs+=("$1"); shift; done
    shift
    flags=("$@")
    rm -rf "$objs"
    mkdir -p "$objs"
    # -c with several inputs writes <basename>.o into the working directory.
    (cd "$objs" && "$CLANG" "${C_CFLAGS[@]}" "${flags[@]}" -c "${srcs[@]}")
    "$CLANG" "${C_LDFLAGS[@]}" "$objs"/*.o -o "$OUT/$name.wasm.tmp"
    mv "$OUT/$name.wasm.tmp" "$OUT/$name.wasm"
    echo "built       target/workloads/threads/$name.wasm"
}

c_fresh() { echo "up to date  target/workloads/threads/$1.wasm"; }

# up_to_date OUTPUT INPUT... : true when OUTPUT exists and is newer than every input.
up_to_date() {
    local out=$1 in
    shift
    [[ -e $out ]] || return 1
    for in in "$@"; do [[ $out -nt $in ]] || return 1; done
}

build_c() {
    local name=$1 c="$SRC/c"
    local deps=("$SELF" "$LOCK" "$SYSROOT/.roam-key" "$c/threads_common.h" "$c/$name.c")
    case $name in
    threads-pthreads)
        if up_to_date "$OUT/$name.wasm" "${deps[@]}"; then c_fresh "$name"; return; fi
        c_build "$name" "$c/$name.c" -- -Wall -Wextra -I"$c"
        ;;
    threads-zstd)
        if up_to_date "$OUT/$name.wasm" "${deps[@]}" "$REAL_LOCK"; then c_fresh "$name"; return; fi
        unpack "$REAL_LOCK" zstd
        local z="$DIR/lib"
        # As workloads/real/build.sh builds zstd (no asm, no legacy formats;
        # -w: third-party warnings are not ours), plus ZSTD_MULTITHREAD:
        # lib/common/threading.c maps zstd's threads onto pthreads.
        c_build "$name" "$z"/common/*.c "$z"/compress/*.c "$z"/decompress/*.c "$c/$name.c" -- \
            -w -DZSTD_MULTITHREAD -DZSTD_DISABLE_ASM -DZSTD_LEGACY_SUPPORT=0 -I"$z" -I"$z/common" -I"$c"
        ;;
    esac
}

c_tools || exit 0
sysroot
c_probe || exit 0
for name in "${want_c[@]}"; do build_c "$name"; done
