import sys
import time

print("ready", flush=True)
try:
    time.sleep(120)
except KeyboardInterrupt:
    print("interrupted", flush=True)
    sys.exit(3)
