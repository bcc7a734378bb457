#!/usr/bin/env bash
# Builds the real-program suite (see docs/workloads.md, "The real-program
# suite", and workloads/real/suite.toml):
#   target/workloads/real/<name>.wasm    every program, WASI preview 1
#   target/workloads/real/data/...       the input files some runs read on stdin
# Third-party sources are downloaded from package registries at build time,
# verified against workloads/real/sources.lock (sha256) and unpacked under
# target/real-src/ (downloads are cached there by hash). Nothing third-party
# is committed.
#
# Usage: workloads/real/build.sh [name...]   (default: all). Runs from any
# directory. Outputs newer than their inputs are left alone. A missing tool
# skips the programs that need it with a warning, except under CI=true,
# where it is an error.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
REAL="$ROOT/workloads/real"
OUT="$ROOT/target/workloads/real"
SRC="$ROOT/target/real-src"
LOCK="$REAL/sources.lock"
SELF="$REAL/build.sh"
PROGRAMS=(lua zstd coremark crates-mix json-stl golua sqlite quickjs)
CLANG="${CLANG:-clang-16}"
CLANGXX="${CLANGXX:-clang++-16}"
# -w: third-party code, its warnings are not ours to fix.
WASM_CFLAGS=(--target=wasm32-wasi -O2 -w -Wl,-z,stack-size=1048576)
# Debian's libc++ for wasm32-wasi (packages libc++-16-dev-wasm32 and
# libc++abi-16-dev-wasm32) installs its headers here, not where clang looks.
LIBCXX_INCLUDE="${LIBCXX_INCLUDE:-/usr/lib/llvm-16/include/wasm32-wasi/c++/v1}"

die() { echo "real/build.sh: error: $*" >&2; exit 1; }
warn() { echo "real/build.sh: warning: $*" >&2; }

# missing WHAT HINT: a prerequisite is absent. Under CI that fails the build;
# otherwise it warns and the caller skips its program.
missing() {
    if [[ ${CI:-} == true ]]; then die "$1 is missing: $2"; fi
    warn "$1 is missing, skipping: $2"
}
have() { command -v "$1" >/dev/null; }

want=()
if [[ $# -eq 0 ]]; then
    want=("${PROGRAMS[@]}")
else
    for name in "$@"; do
        [[ " ${PROGRAMS[*]} " == *" $name "* ]] || die "unknown program '$name' (known: ${PROGRAMS[*]})"
        want+=("$name")
    done
fi

# up_to_date OUTPUT INPUT... : true when OUTPUT exists and is newer than every input.
up_to_date() {
    local out=$1 in
    shift
    [[ -e $out ]] || return 1
    for in in "$@"; do [[ $out -nt $in ]] || return 1; done
}

# fetch NAME: download (cached by hash), verify and unpack the archive that
# sources.lock pins for NAME; sets $DIR to the unpacked tree and $ARCHIVE to
# the verified download.
fetch() {
    local name=$1 line version sha url file tmp
    line="$(awk -v n="$name" '$1 == n && NF == 4 { print; exit }' "$LOCK")"
    [[ -n $line ]] || die "no entry for '$name' in $LOCK"
    read -r _ version sha url <<<"$line"
    mkdir -p "$SRC/dl"
    file="$SRC/dl/$sha-${url##*/}"
    if [[ ! -e $file ]]; then
        have curl || die "curl is missing: install the Debian package curl"
        echo "download    $url"
        tmp="$file.part"
        curl -fsSL --retry 3 --connect-timeout 30 -o "$tmp" "$url" || die "download of $url failed"
        local got
        got="$(sha256sum "$tmp" | cut -d' ' -f1)"
        if [[ $got != "$sha" ]]; then
            rm -f "$tmp"
            die "sha256 mismatch for $url: expected $sha (sources.lock), got $got"
        fi
        mv "$tmp" "$file"
    fi
    ARCHIVE="$file"
    DIR="$SRC/$name-$version"
    if [[ ! -e $DIR/.roam-unpacked ]] || [[ $(cat "$DIR/.roam-unpacked") != "$sha" ]]; then
        # Verify again: the cache could have been tampered with or truncated.
        [[ $(sha256sum "$file" | cut -d' ' -f1) == "$sha" ]] || die "cached $file does not match sources.lock; delete it"
        rm -rf "$DIR"
        mkdir -p "$DIR"
        tar -xf "$file" -C "$DIR" --strip-components=1
        echo "$sha" >"$DIR/.roam-unpacked"
    fi
}

# embed NAME FILE OUT: FILE as a C array NAME[] of NAME_len bytes.
embed() {
    { echo "static const unsigned char $1[] = {"
      od -An -v -tx1 "$2" | sed -E 's/ ([0-9a-f]{2})/0x\1,/g'
      echo "};"
      echo "static const unsigned int $1_len = sizeof($1);"; } >"$3"
}

built() { echo "built       target/workloads/real/$1"; }
fresh() { echo "up to date  target/workloads/real/$1"; }

check_clang() {
    [[ -n ${CLANG_OK:-} ]] && return 0
    have "$CLANG" || { missing "$CLANG" "install the Debian packages clang-16 lld-16"; return 1; }
    local probe
    probe="$(mktemp -d)"
    echo 'int main(void) { return 0; }' >"$probe/p.c"
    if ! "$CLANG" "${WASM_CFLAGS[@]}" "$probe/p.c" -o "$probe/p.wasm" 2>"$probe/err"; then
        cat "$probe/err" >&2
        rm -rf "$probe"
        missing "a wasm32-wasi C toolchain" "install the Debian packages wasi-libc lld-16 libclang-rt-16-dev-wasm32"
        return 1
    fi
    rm -rf "$probe"
    CLANG_OK=1
}

mkdir -p "$OUT" "$OUT/data"

# ---- lua: Lua 5.4 standalone interpreter --------------------------------------
build_lua() {
    check_clang || return 0
    local out="$OUT/lua.wasm"
    if up_to_date "$out" "$LOCK" "$SELF" "$REAL/lua/wasi_compat.c" "$REAL/compat/setjmp.h"; then fresh lua.wasm; return; fi
    fetch lua
    local srcs=()
    for f in "$DIR"/src/*.c; do [[ ${f##*/} == luac.c ]] || srcs+=("$f"); done
    # No setjmp/longjmp on wasm32-wasi here: a Lua error aborts the program
    # (the benchmark script raises none). Fixed string-hash seed instead of
    # time() and addresses, so runs are deterministic.
    "$CLANG" "${WASM_CFLAGS[@]}" -I"$REAL/compat" \
        -D_WASI_EMULATED_SIGNAL -D_WASI_EMULATED_PROCESS_CLOCKS \
        '-DLUAI_THROW(L,c)=abort()' '-DLUAI_TRY(L,c,a)=do{a}while(0)' -Dluai_jmpbuf=int \
        -DLUA_TMPNAMBUFSIZE=32 '-Dlua_tmpnam(b,e)={e=1;}' '-Dluai_makeseed(L)=0x2545F491u' \
        "${srcs[@]}" "$REAL/lua/wasi_compat.c" -o "$out" \
        -lwasi-emulated-signal -lwasi-emulated-process-clocks
    built lua.wasm
}
# The script lua runs, read on stdin (suite.toml: stdin = "data/bench.lua").
copy_lua_script() {
    if ! up_to_date "$OUT/data/bench.lua" "$REAL/lua/bench.lua"; then
        cp "$REAL/lua/bench.lua" "$OUT/data/bench.lua"
        built data/bench.lua
    fi
}

# ---- zstd: the zstd command-line tool, and its input files -------------------
build_zstd() {
    check_clang || return 0
    local out="$OUT/zstd.wasm"
    if up_to_date "$out" "$LOCK" "$SELF" "$REAL/zstd/wasi_compat.h"; then
        fresh zstd.wasm
    else
        fetch zstd
        local d=$DIR
        "$CLANG" "${WASM_CFLAGS[@]}" -include "$REAL/zstd/wasi_compat.h" \
            -D_WASI_EMULATED_SIGNAL -D_WASI_EMULATED_PROCESS_CLOCKS -D_WASI_EMULATED_GETPID \
            -DZSTD_DISABLE_ASM -DZSTD_NOBENCH -DZSTD_NODICT -DZSTD_NOTRACE -DZSTD_LEGACY_SUPPORT=0 \
            -I"$d/lib" -I"$d/lib/common" \
            "$d"/lib/common/*.c "$d"/lib/compress/*.c "$d"/lib/decompress/*.c \
            "$d/programs/zstdcli.c" "$d/programs/fileio.c" "$d/programs/fileio_asyncio.c" \
            "$d/programs/util.c" "$d/programs/timefn.c" -o "$out" \
            -lwasi-emulated-signal -lwasi-emulated-process-clocks -lwasi-emulated-getpid
        built zstd.wasm
    fi
    # Inputs, made deterministically from verified archives: the uncompressed
    # tar streams of two source archives, and their zstd-compressed forms
    # (made with the host's zstd; any valid frame will do) for decompression.
    local data="$OUT/data"
    if ! up_to_date "$data/corpus-S.tar" "$LOCK"; then
        fetch lua
        gzip -dc "$ARCHIVE" >"$data/corpus-S.tar"
        built data/corpus-S.tar
    fi
    if ! up_to_date "$data/corpus-L.tar" "$LOCK"; then
        fetch json
        gzip -dc "$ARCHIVE" >"$data/corpus-L.tar"
        built data/corpus-L.tar
    fi
    local size
    for size in S L; do
        if ! up_to_date "$data/corpus-$size.tar.zst" "$data/corpus-$size.tar"; then
            have zstd || { missing zstd "install the Debian package zstd (it compresses the inputs of unzstd)"; return 0; }
            zstd -q -f -3 "$data/corpus-$size.tar" -o "$data/corpus-$size.tar.zst"
            built "data/corpus-$size.tar.zst"
        fi
    done
}

# ---- sqlite: SQLite's speedtest1 benchmark --------------------------------------
build_sqlite() {
    check_clang || return 0
    local out="$OUT/sqlite.wasm"
    if up_to_date "$out" "$LOCK" "$SELF" "$REAL/sqlite/wasi_vfs.c"; then fresh sqlite.wasm; return; fi
    have tclsh || { missing tclsh "install the Debian package tcl (SQLite's build generates its amalgamation with it)"; return 0; }
    have gcc || have cc || { missing "a host C compiler" "install the Debian package build-essential"; return 0; }
    fetch sqlite
    local d=$DIR bld="$DIR/roam-build"
    if [[ ! -e $bld/sqlite3.c ]]; then
        echo "generate    sqlite3.c (the amalgamation)"
        rm -rf "$bld"
        mkdir -p "$bld"
        (cd "$bld" && "$d/configure" --disable-tcl >configure.log 2>&1 && make sqlite3.c >make.log 2>&1) ||
            die "generating the SQLite amalgamation failed; see $bld/configure.log and $bld/make.log"
    fi
    # SQLITE_OS_OTHER: no unix VFS (WASI lacks its locking and permission
    # calls); wasi_vfs.c supplies a memory-only one. speedtest1 runs --memdb.
    "$CLANG" "${WASM_CFLAGS[@]}" -I"$bld" \
        -DSQLITE_OS_OTHER=1 -DSQLITE_THREADSAFE=0 -DSQLITE_OMIT_LOAD_EXTENSION -DSQLITE_OMIT_WAL \
        -DSQLITE_TEMP_STORE=3 \
        "$bld/sqlite3.c" "$d/test/speedtest1.c" "$REAL/sqlite/wasi_vfs.c" -o "$out"
    built sqlite.wasm
}

# ---- quickjs: the QuickJS engine under a small driver -------------------------
build_quickjs() {
    check_clang || return 0
    local out="$OUT/quickjs.wasm"
    if up_to_date "$out" "$LOCK" "$SELF" "$REAL/quickjs/driver.c" "$REAL/quickjs/bench.js"; then fresh quickjs.wasm; return; fi
    fetch quickjs
    local q="$DIR/upstream-quickjs" gen="$DIR/roam-gen"
    mkdir -p "$gen"
    embed bench_js "$REAL/quickjs/bench.js" "$gen/bench_js.h"
    # EMSCRIPTEN is QuickJS's own switch for wasm targets: no Atomics (no
    # threads), no native stack check, switch dispatch. wasm has only
    # round-to-nearest, so fesetround to these modes fails and toFixed rounds
    # ties to nearest (deterministically).
    "$CLANG" "${WASM_CFLAGS[@]}" -I"$q" -I"$gen" \
        -DCONFIG_VERSION="\"$(cat "$q/VERSION")\"" -DCONFIG_BIGNUM -DEMSCRIPTEN \
        -DFE_DOWNWARD=0x400 -DFE_UPWARD=0x800 \
        "$q/quickjs.c" "$q/libregexp.c" "$q/libunicode.c" "$q/cutils.c" "$q/libbf.c" \
        "$REAL/quickjs/driver.c" -o "$out"
    built quickjs.wasm
}

# ---- json-stl: C++ on nlohmann/json and libc++ ---------------------------------
build_json_stl() {
    check_clang || return 0
    local out="$OUT/json-stl.wasm"
    if up_to_date "$out" "$LOCK" "$SELF" "$REAL/cpp/json_stl.cpp"; then fresh json-stl.wasm; return; fi
    have "$CLANGXX" || { missing "$CLANGXX" "install the Debian package clang-16"; return 0; }
    [[ -e $LIBCXX_INCLUDE/vector ]] ||
        { missing "libc++ for wasm32-wasi" "install the Debian packages libc++-16-dev-wasm32 libc++abi-16-dev-wasm32"; return 0; }
    fetch json
    "$CLANGXX" "${WASM_CFLAGS[@]}" -std=c++17 -fno-exceptions -isystem "$LIBCXX_INCLUDE" \
        -DJSON_NOEXCEPTION -DJSON_HAS_FILESYSTEM=0 -DJSON_HAS_EXPERIMENTAL_FILESYSTEM=0 \
        -I"$DIR/single_include" "$REAL/cpp/json_stl.cpp" -o "$out" -lc++ -lc++abi
    built json-stl.wasm
}

# ---- Rust: coremark and crates-mix ----------------------------------------------
build_rust() {
    local names=("$@")
    have cargo || { missing cargo "install Rust with rustup (https://rustup.rs)"; return 0; }
    [[ -d "$(rustc --print sysroot)/lib/rustlib/wasm32-wasip1" ]] ||
        { missing "the Rust target wasm32-wasip1" "run 'rustup target add wasm32-wasip1'"; return 0; }
    local cargo_out="$ROOT/target/real-cargo" pkgs=() name bin
    for name in "${names[@]}"; do
        case $name in coremark) pkgs+=(-p coremark-run) ;; crates-mix) pkgs+=(-p crates-mix) ;; esac
    done
    (cd "$REAL/rust" && CARGO_TARGET_DIR="$cargo_out" cargo build --quiet --release --locked \
        --target wasm32-wasip1 "${pkgs[@]}")
    for name in "${names[@]}"; do
        bin="$cargo_out/wasm32-wasip1/release/$name.wasm"
        if [[ -e $OUT/$name.wasm ]] && cmp -s "$bin" "$OUT/$name.wasm"; then fresh "$name.wasm"
        else cp "$bin" "$OUT/$name.wasm"; built "$name.wasm"; fi
    done
}

# ---- golua: gopher-lua (Go, GOOS=wasip1) ------------------------------------------
build_golua() {
    local out="$OUT/golua.wasm" g="$REAL/go"
    if up_to_date "$out" "$SELF" "$g/go.mod" "$g/go.sum" "$g/main.go" "$g/bench.lua"; then fresh golua.wasm; return; fi
    have go || { missing go "install Go 1.21 or newer (GOOS=wasip1); Debian bookworm's golang is too old"; return 0; }
    local v
    v="$(go env GOVERSION)"
    [[ $v =~ ^go1\.([0-9]+) ]] && ((BASH_REMATCH[1] >= 21)) ||
        { missing "Go >= 1.21" "found $v; GOOS=wasip1 needs Go 1.21 or newer"; return 0; }
    # go.sum pins the module's hash; -mod=readonly refuses anything not in it.
    (cd "$g" && GOTOOLCHAIN=local GOFLAGS=-mod=readonly GOOS=wasip1 GOARCH=wasm \
        go build -trimpath -buildvcs=false -o "$out" .)
    built golua.wasm
}

rust=()
for name in "${want[@]}"; do
    case $name in
        lua) build_lua; copy_lua_script ;;
        zstd) build_zstd ;;
        sqlite) build_sqlite ;;
        quickjs) build_quickjs ;;
        json-stl) build_json_stl ;;
        golua) build_golua ;;
        coremark | crates-mix) rust+=("$name") ;;
    esac
done
if [[ ${#rust[@]} -gt 0 ]]; then build_rust "${rust[@]}"; fi
