"""goodput-instrument's sitecustomize: loaded by Python's `site` at the start of every interpreter whose PYTHONPATH
holds this directory (goodput-instrument puts it there; a pod mounts the daemon's published copy there). It loads the
goodput_client package that ships with it, boots the instrumentation, then runs the next `sitecustomize` on the path,
if any (the image's own), as OpenTelemetry's does. Nothing here raises into the interpreter."""

import os
import sys


def _here() -> str:
    return os.path.dirname(os.path.realpath(__file__))  # DIR/current resolved: later imports read the same version


def _package_dir() -> str:
    here = _here()
    beside = os.path.join(here, "goodput_client")  # the published layout: DIR/sitecustomize.py, DIR/goodput_client/
    if os.path.isfile(os.path.join(beside, "__init__.py")):
        return beside
    return os.path.dirname(os.path.dirname(here))  # installed: goodput_client/instrument/autoload/


def _load_client() -> None:
    """Import the goodput_client that ships with this file (not another one the job may have installed), without
    putting its parent directory (a site-packages) on sys.path."""
    if "goodput_client" in sys.modules:
        return
    import importlib.util

    package = _package_dir()
    spec = importlib.util.spec_from_file_location("goodput_client", os.path.join(package, "__init__.py"),
                                                  submodule_search_locations=[package])
    if spec is None or spec.loader is None:
        raise ImportError(f"no goodput_client package in {package}")
    module = importlib.util.module_from_spec(spec)
    sys.modules["goodput_client"] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules["goodput_client"]
        raise


def _chain() -> None:
    """Run the next sitecustomize on sys.path, the one this file hides."""
    import importlib.machinery
    import importlib.util

    here = os.path.realpath(_here())
    rest = [entry for entry in sys.path if os.path.realpath(entry or os.getcwd()) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None or spec.origin == __file__:
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


_OFF = ("0", "false", "no", "off")  # GOODPUT_INSTRUMENT values that load nothing (settings.ENABLE_ENV)

try:
    # an older interpreter may find this file on its path: it runs without the instrumentation
    if sys.version_info >= (3, 9) and os.environ.get("GOODPUT_INSTRUMENT", "1").strip().lower() not in _OFF:
        _load_client()
        from goodput_client.instrument.boot import boot

        boot()
except Exception as _exc:  # never into the interpreter: it runs without the instrumentation
    sys.stderr.write(f"goodput-instrument: not loaded: {_exc.__class__.__name__}: {_exc}\n")
_chain()
