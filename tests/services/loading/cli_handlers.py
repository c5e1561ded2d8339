from services.loading import _handler
from services.loading.by_cli import app

app.handler("loading.ping")(_handler.on_ping)
