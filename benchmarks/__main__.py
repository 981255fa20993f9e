"""Run every benchmark and print its table."""

from benchmarks import load_generator

if __name__ == "__main__":
    load_generator.main()
