import sys
import time

try:  # announce readiness inside the try: a Ctrl-C that arrives just after the line is still caught
    print("ready", flush=True)
    time.sleep(120)
except KeyboardInterrupt:
    print("interrupted", flush=True)
    sys.exit(3)
