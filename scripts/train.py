"""One training stage, for `accelerate launch` (any number of processes, DeepSpeed through accelerate):

    accelerate launch scripts/train.py --config configs/stage2.yaml --stage 2 [key=value ...]

Runs exactly what `memento-train train` runs.
"""

import sys

from memento_train.cli import main

if __name__ == "__main__":
    sys.exit(main(["train", *sys.argv[1:]]))
