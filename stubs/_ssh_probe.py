"""The ssh backend's probe, run by the remote Python when an environment starts: prints
the user's home, the Python version, whether the working directory (argv[1], else the
home) exists, and whether the stdlib the runtime imports is there (python3-minimal
lacks json)."""

import os
import sys

home = os.path.expanduser("~")
workdir = sys.argv[1] or home
print(home)
print("%d.%d" % sys.version_info[:2])
print("dir" if os.path.isdir(workdir) else "missing")
try:
    import json
    import selectors
    import socket
    import subprocess
    import threading

    print("ok")
except ImportError as exc:
    print("missing module: %s" % exc)
