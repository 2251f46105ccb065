"""`roost run`: the aiohttp app, HTTP guard, /healthz, /metrics, sd_notify."""
