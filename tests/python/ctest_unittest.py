"""`python ctest_unittest.py NAME...` runs `python -m unittest -v NAME...` for CTest, whose test passes or fails
on the exit status alone: a run in which any test was skipped, and none failed, exits SKIPPED (CTest's
SKIP_RETURN_CODE in tests/CMakeLists.txt), so a check that did not happen reads as "Skipped", never as "Passed".
The skipped tests and their reasons are the last lines of the output.
"""
import sys
import unittest

SKIPPED = 77  # keep in step with convnets_python_test's SKIP_RETURN_CODE


def main(names):
    program = unittest.main(module=None, argv=[sys.argv[0], "-v", *names], exit=False)
    result = program.result
    if not result.wasSuccessful():
        return 1
    if result.testsRun == 0 and not result.skipped:  # a setUpClass skip counts no test as run
        print("ctest_unittest: no test ran for " + " ".join(names), file=sys.stderr)
        return 1
    if result.skipped:
        print(f"ctest_unittest: {len(result.skipped)} of {result.testsRun} skipped, reported to CTest as a skip:",
              file=sys.stderr)
        for test, reason in result.skipped:
            print(f"  {test.id()}: {reason}", file=sys.stderr)
        return SKIPPED
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
