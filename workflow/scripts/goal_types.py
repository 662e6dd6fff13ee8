"""Figure 4 (the `goal_types` rule): the goal types of the environment's catalogue, as PNG and PDF.

python workflow/scripts/goal_types.py results/figure4.png
"""

import sys
from pathlib import Path

from sacglam_core.reports.figures import goal_types_figure, write_figure

write_figure(goal_types_figure(), Path(sys.argv[1]).with_suffix(""))
