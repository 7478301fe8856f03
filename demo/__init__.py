"""``manage.py terminal_demo``: Tether's promises shown end to end (phases.py), with a console that speaks to the
owner worker as a page's socket does (console.py) and the machine, worker and person it runs with (world.py).
Uses the apps; nothing uses it."""
