"""The Triton kernels: fused ops (ops/), their launch planning (plan/) and launch runtime (runtime/).

Importing the package pins Triton's default for floating-point contraction (a * b + c as
one FMA) to on, the default the kernels were built and measured with: Triton 3.9 warns
that 3.10 turns it off where a kernel does not ask, which would change the kernels'
rounding and add instructions to every epilogue. A value the user set stands.
"""

import os

os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
