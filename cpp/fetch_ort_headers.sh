#!/usr/bin/env bash
# Obtain ONNX Runtime's C API headers and a linkable libonnxruntime for the C++ host, from package registries only.
#
# Result (git-ignored cache): cpp/third_party/ort/include/onnxruntime_c_api.h (+ the other public headers) and
# cpp/third_party/ort/lib/libonnxruntime.so{,.1} -> the shared library. Prints that prefix on stdout.
#
# Headers, first found wins:
#   1. $ORT_INCLUDE_DIR (Jetson: JetPack's / jetson-containers' ORT, e.g. /usr/local/include/onnxruntime)
#   2. the cache above
#   3. /usr/include/onnxruntime (Debian/Ubuntu libonnxruntime-dev installed)
#   4. Debian trixie's libonnxruntime-dev .deb (headers only, 85 kB), fetched with apt-get into a private state
#      directory (the system's apt configuration is not touched) and unpacked with dpkg-deb.
#      Bookworm has no libonnxruntime-dev; trixie's is ORT 1.21 (C API version 21). The C API is ABI-stable: the
#      host asks the library for API version ORT_API_VERSION of these headers, which any newer library serves.
# Library, first found wins:
#   1. $ORT_LIB (a libonnxruntime.so* file)
#   2. the onnxruntime PyPI wheel of $PYTHON (default python3): site-packages/onnxruntime/capi/libonnxruntime.so.*
#   3. /usr/lib/*/libonnxruntime.so* or /usr/local/lib/libonnxruntime.so*
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
prefix="$here/third_party/ort"
python="${PYTHON:-python3}"
log() { echo "fetch_ort_headers: $*" >&2; }
die() { log "error: $*"; exit 1; }

mkdir -p "$prefix/include" "$prefix/lib"

# -- headers -------------------------------------------------------------------------------------------------------
copy_headers() {  # $1: a folder holding onnxruntime_c_api.h
    cp "$1"/*.h "$prefix/include/"
    echo "$2" > "$prefix/include/SOURCE"
}

if [[ -n "${ORT_INCLUDE_DIR:-}" ]]; then
    [[ -f "$ORT_INCLUDE_DIR/onnxruntime_c_api.h" ]] || die "ORT_INCLUDE_DIR=$ORT_INCLUDE_DIR has no onnxruntime_c_api.h"
    copy_headers "$ORT_INCLUDE_DIR" "ORT_INCLUDE_DIR=$ORT_INCLUDE_DIR"
elif [[ -f "$prefix/include/onnxruntime_c_api.h" ]]; then
    log "headers cached ($(cat "$prefix/include/SOURCE" 2>/dev/null || echo unknown source))"
elif [[ -f /usr/include/onnxruntime/onnxruntime_c_api.h ]]; then
    copy_headers /usr/include/onnxruntime "/usr/include/onnxruntime"
else
    command -v apt-get >/dev/null || die "no ORT headers: set ORT_INCLUDE_DIR, or install libonnxruntime-dev"
    work="$(mktemp -d)"
    trap 'rm -rf "$work"' EXIT
    mkdir -p "$work/lists/partial" "$work/cache/archives/partial"
    keyring=/usr/share/keyrings/debian-archive-keyring.gpg
    [[ -f "$keyring" ]] || die "no Debian archive keyring at $keyring: set ORT_INCLUDE_DIR instead"
    echo "deb [signed-by=$keyring] http://deb.debian.org/debian trixie main" > "$work/sources.list"
    apt_opts=(-o "Dir::Etc::SourceList=$work/sources.list" -o "Dir::Etc::SourceParts=$work/none"
              -o "Dir::State::Lists=$work/lists" -o "Dir::Cache=$work/cache" -o "APT::Sandbox::User=root"
              -o "Debug::NoLocking=1" -qq)
    log "fetching libonnxruntime-dev from Debian trixie (headers only)"
    apt-get "${apt_opts[@]}" update >&2 || die "apt-get update of the trixie index failed"
    (cd "$work" && apt-get "${apt_opts[@]}" download libonnxruntime-dev >&2) || die "apt-get download failed"
    deb="$(ls "$work"/libonnxruntime-dev_*.deb)"
    dpkg-deb -x "$deb" "$work/x"
    copy_headers "$work/x/usr/include/onnxruntime" "Debian trixie $(basename "$deb")"
fi
[[ -f "$prefix/include/onnxruntime_c_api.h" ]] || die "headers missing after fetch"

# -- library -------------------------------------------------------------------------------------------------------
lib="${ORT_LIB:-}"
if [[ -z "$lib" ]]; then
    lib="$("$python" - <<'EOF' 2>/dev/null || true
import glob, os
import onnxruntime
capi = os.path.join(os.path.dirname(onnxruntime.__file__), "capi")
libs = sorted(glob.glob(os.path.join(capi, "libonnxruntime.so*")))
print(libs[-1] if libs else "")
EOF
)"
fi
if [[ -z "$lib" ]]; then
    lib="$(ls /usr/lib/*/libonnxruntime.so* /usr/local/lib/libonnxruntime.so* 2>/dev/null | head -n1 || true)"
fi
[[ -n "$lib" && -f "$lib" ]] || die "no libonnxruntime.so: pip install onnxruntime, or set ORT_LIB"
lib="$(readlink -f "$lib")"
ln -sf "$lib" "$prefix/lib/libonnxruntime.so.1"
ln -sf "$lib" "$prefix/lib/libonnxruntime.so"
echo "$lib" > "$prefix/lib/SOURCE"
log "headers: $(cat "$prefix/include/SOURCE"); library: $lib"
echo "$prefix"
