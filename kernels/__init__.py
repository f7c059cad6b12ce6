"""HIP C++ kernel sources (one op per .hip file), hip_compat.h and the build script.

Installed as the package `rocmforge_kernels` so that a wheel carries the sources (for run-time
compilation) and the precompiled code objects under prebuilt/.
"""
