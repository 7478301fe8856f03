"""Write frontend/wire.js, the browser's copy of the protocol's words, from terminals/protocol/."""

from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand

from terminals.protocol.wire import wire_js

WIRE_JS = Path(settings.BASE_DIR) / "frontend" / "wire.js"


class Command(BaseCommand):
    help = "Write frontend/wire.js from terminals/protocol/ (the page's close codes, reasons, codes and message types)."

    def handle(self, *args, **options) -> None:
        WIRE_JS.write_text(wire_js())
        self.stdout.write(f"wrote {WIRE_JS}")
