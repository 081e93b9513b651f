"""cmasd: confidence-modulated adaptive speculative decoding for fairseq."""

from setuptools import find_packages, setup

setup(
    name="cmasd",
    version="0.1.0",
    description="Speculative decoding (CM-ASD, SpecDec and neighbours) for fairseq encoder-decoder models",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["cmasd", "cmasd.*", "fairseq_plugins", "fairseq_plugins.*"]),
    install_requires=[
        # The fairseq 0.12 line: stock 0.12.2 fails to import on Python >= 3.11
        # ("mutable default ... use default_factory"); ve-fairseq 0.12.3 is the same
        # code with that fix, as prebuilt cp311/cp312 wheels.
        "fairseq==0.12.2; python_version < '3.11'",
        "ve-fairseq==0.12.3; python_version >= '3.11'",
        # A bare "torch" pulls a multi-GB CUDA build: the Makefile installs
        # torch==2.13.0 first, and this range is then already satisfied.
        "torch>=1.13,<2.15",
        "numpy>=1.21",
        "sentencepiece>=0.1.99",
        "sacrebleu>=2.0,<3",
        "rouge-score>=0.1.2",
        "matplotlib>=3.5",
        # builds the gemv kernel (cmasd/layers/csrc) on first use with the system's C++ compiler
        "ninja",
    ],
    package_data={"cmasd.layers": ["csrc/*.cpp"]},
    extras_require={
        "test": ["pytest>=7", "pytest-xdist>=3", "hypothesis>=6"],
        # cmasd-bench's ct2-greedy rows: the engine fairseq users deploy on CPUs.
        "ct2": ["ctranslate2>=4,<5"],
    },
    entry_points={
        "console_scripts": [
            "cmasd-bench = cmasd.tools.bench:cli_main",
            "cmasd-tune = cmasd.tools.tune:cli_main",
            "cmasd-prep = cmasd.tools.prep:cli_main",
            "cmasd-rouge = cmasd.tools.rouge:cli_main",
            "cmasd-trace = cmasd.tools.trace:cli_main",
        ],
    },
)
