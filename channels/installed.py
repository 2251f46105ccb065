"""The platforms this roost has, one line each: the entry points (daemon/cli/main.py,
daemon/app/) import this module, which installs them in the core's registry
(daemon/core/platforms.py). Adding a platform is its folder under channels/ and a line here."""

from channels.matrix.platform import MATRIX
from channels.telegram.platform import TELEGRAM
from channels.whatsapp.platform import WHATSAPP
from daemon.core.platforms import install

PLATFORMS = (TELEGRAM, WHATSAPP, MATRIX)
install(PLATFORMS)
