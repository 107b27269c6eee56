import os

# OpenMP threads that sleep when idle, not spin: with a spinning wait policy, torch's two
# threads and a job on the other core slow each other down many times over on a 2-core machine.
# Read once, when torch loads its OpenMP library: here, before any test module imports torch.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
