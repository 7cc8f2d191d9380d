#!/usr/bin/env python3
"""Prints an installed distribution's requirements for this interpreter, one
per line, leaving out the ones named after --except; scripts/test_python.sh
installs torch and accelerate this way, without triton.

    requirements_of.py DIST [--except NAME ...]
"""
import argparse
import importlib.metadata

# pip carries packaging; the venv may not have it as a package of its own yet.
try:
    from packaging.requirements import Requirement
except ImportError:
    from pip._vendor.packaging.requirements import Requirement


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dist")
    parser.add_argument("--except", dest="excluded", nargs="*", default=[])
    args = parser.parse_args()
    excluded = {name.lower().replace("_", "-") for name in args.excluded}
    for text in importlib.metadata.requires(args.dist) or []:
        requirement = Requirement(text)
        if requirement.name.lower().replace("_", "-") in excluded:
            continue
        # Extras' requirements are not wanted; markers are evaluated for this
        # interpreter and platform with no extra set.
        if requirement.marker and not requirement.marker.evaluate({"extra": ""}):
            continue
        requirement.marker = None
        print(requirement)


if __name__ == "__main__":
    main()
