#!/usr/bin/env bash
# Obtain ONNX Runtime's C API headers and a linkable libonnxruntime for the C++ host, and nlohmann/json's headers
# where the system has none, from package registries only.
#
# Result (git-ignored cache): cpp/third_party/ort/include/onnxruntime_c_api.h (+ the other public headers) and
# cpp/third_party/ort/lib/libonnxruntime.so{,.1} -> the shared library. Prints that prefix on stdout.
# nlohmann/json, first found wins: /usr/include/nlohmann/json.hpp (nlohmann-json3-dev installed; CMake finds it), the
# cache cpp/third_party/nlohmann (include/ + share/cmake/), Debian trixie's nlohmann-json3-dev .deb (headers only,
# architecture-independent) fetched like the ORT headers. OpenSSL's libcrypto comes from the system (libssl-dev).
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
json_prefix="$here/third_party/nlohmann"
python="${PYTHON:-python3}"
log() { echo "fetch_ort_headers: $*" >&2; }
die() { log "error: $*"; exit 1; }

mkdir -p "$prefix/include" "$prefix/lib"

work=""
cleanup() { [[ -z "$work" ]] || rm -rf "$work"; }
trap cleanup EXIT
fetch_deb() {  # $1: a package of Debian trixie; unpacks its .deb into $work/$1 (the system's apt is not touched)
    command -v apt-get >/dev/null || die "no apt-get to fetch $1 with: install it, or see the options above"
    keyring=/usr/share/keyrings/debian-archive-keyring.gpg
    [[ -f "$keyring" ]] || die "no Debian archive keyring at $keyring: install $1 another way"
    if [[ -z "$work" ]]; then
        work="$(mktemp -d)"
        mkdir -p "$work/lists/partial" "$work/cache/archives/partial"
        echo "deb [signed-by=$keyring] http://deb.debian.org/debian trixie main" > "$work/sources.list"
        apt_opts=(-o "Dir::Etc::SourceList=$work/sources.list" -o "Dir::Etc::SourceParts=$work/none"
                  -o "Dir::State::Lists=$work/lists" -o "Dir::Cache=$work/cache" -o "APT::Sandbox::User=root"
                  -o "Debug::NoLocking=1" -qq)
        apt-get "${apt_opts[@]}" update >&2 || die "apt-get update of the trixie index failed"
    fi
    log "fetching $1 from Debian trixie"
    (cd "$work" && apt-get "${apt_opts[@]}" download "$1" >&2) || die "apt-get download $1 failed"
    deb="$(ls "$work/$1"_*.deb)"
    dpkg-deb -x "$deb" "$work/$1"
}

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
    fetch_deb libonnxruntime-dev
    copy_headers "$work/libonnxruntime-dev/usr/include/onnxruntime" "Debian trixie $(basename "$deb")"
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

# -- nlohmann/json -------------------------------------------------------------------------------------------------
if [[ -f /usr/include/nlohmann/json.hpp ]]; then
    json_source="/usr/include/nlohmann (installed)"
elif [[ -f "$json_prefix/include/nlohmann/json.hpp" ]]; then
    json_source="cached ($(cat "$json_prefix/SOURCE" 2>/dev/null || echo unknown source))"
else
    fetch_deb nlohmann-json3-dev
    rm -rf "$json_prefix" && mkdir -p "$json_prefix/share"
    cp -r "$work/nlohmann-json3-dev/usr/include" "$json_prefix/"
    cp -r "$work/nlohmann-json3-dev/usr/share/cmake" "$json_prefix/share/"
    echo "Debian trixie $(basename "$deb")" > "$json_prefix/SOURCE"
    json_source="$(cat "$json_prefix/SOURCE")"
fi
log "nlohmann/json: $json_source"
echo "$prefix"
