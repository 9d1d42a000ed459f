"""The old import path of `kernels.ground.axes`, the same module object under this name too.

The ground floor (kernels/ground/) is where it lives; import it from there.
"""

import sys

from kernels.ground import axes

sys.modules[__name__] = axes
