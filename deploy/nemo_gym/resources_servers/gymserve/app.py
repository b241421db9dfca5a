"""NeMo-Gym entrypoint for a gymserve environment (docs/nemo-gym-compat.md: "Under NeMo-Gym's launcher")."""
from gymserve.nemo_entrypoint import main

if __name__ == "__main__":
    raise SystemExit(main())
