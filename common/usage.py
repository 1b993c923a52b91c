"""Usage errors of the argparse-based commands (`megha chaos`, the experiments, the secret maker, the burn helper)
in one line, as `megha replay`'s: `<prog>: error: <what is wrong> (see <prog> --help)`, exit status 2. argparse's
own prints the whole usage text first."""

from __future__ import annotations

import argparse
from typing import NoReturn


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line naming the option, then exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")
