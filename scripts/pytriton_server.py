"""Run the tritonserver that PyTriton bundles on a model repository (`spot triton-repo`), without a container.

    VENV/bin/python scripts/pytriton_server.py --model-repository REPO [tritonserver options...]

VENV is a Python environment with spot and nvidia-pytriton (scripts/triton_env.sh VENV makes one: PyTriton pins
numpy < 2, so it gets its own). Run with that environment's python: its pytriton, its Python version and its
site-packages are what the server's Python backend uses. What PyTriton itself does before it starts the server:
  - the Python backend's stub for this Python version is copied next to the backend (a prepared copy of the server
    is kept under $SPOT_CACHE/pytriton/, made once per PyTriton and Python version);
  - LD_LIBRARY_PATH gets PyTriton's bundled libraries and this interpreter's libpython (the stub embeds it);
  - PATH starts with this environment's bin/, so the stub's Python finds the environment's site-packages.
Then tritonserver replaces this process (signals reach it directly). Extra arguments go to tritonserver as given;
--backend-directory is set here.
"""
from __future__ import annotations

import os
import shutil
import sys
import sysconfig
from pathlib import Path


def prepared_server(cache: Path) -> Path:
    """A copy of PyTriton's tritonserver with this Python's backend stub in place (made once, then reused)."""
    import pytriton
    dist = Path(pytriton.__file__).parent / "tritonserver"
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    stub = dist / "python_backend_stubs" / version / "triton_python_backend_stub"
    if not stub.is_file():
        sys.exit(f"error: PyTriton {getattr(pytriton, '__version__', '')} has no Python backend stub for Python "
                 f"{version} (it has: {', '.join(p.name for p in (dist / 'python_backend_stubs').iterdir())})")
    from importlib.metadata import version as package_version
    target = cache / f"pytriton-{package_version('nvidia-pytriton')}-py{version}"
    if not (target / "backends" / "python" / "triton_python_backend_stub").is_file():
        partial = target.with_name(target.name + f".partial-{os.getpid()}")
        shutil.rmtree(partial, ignore_errors=True)
        shutil.copytree(dist, partial, ignore=shutil.ignore_patterns("python_backend_stubs"))
        shutil.copy2(stub, partial / "backends" / "python" / "triton_python_backend_stub")
        try:
            partial.rename(target)
        except OSError:         # another run prepared it meanwhile
            shutil.rmtree(partial, ignore_errors=True)
    return target


def main() -> None:
    from pytriton.utils.distribution import get_libs_path
    cache = Path(os.environ.get("SPOT_CACHE") or Path.home() / ".cache" / "spot") / "pytriton"
    cache.mkdir(parents=True, exist_ok=True)
    server = prepared_server(cache)
    env = dict(os.environ)
    libs = [str(get_libs_path()), sysconfig.get_config_var("LIBDIR")]
    env["LD_LIBRARY_PATH"] = ":".join([*libs, *([env["LD_LIBRARY_PATH"]] if env.get("LD_LIBRARY_PATH") else [])])
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    binary = server / "bin" / "tritonserver"
    os.execve(binary, [str(binary), "--backend-directory", str(server / "backends"), *sys.argv[1:]], env)


if __name__ == "__main__":
    main()
