"""Recordings of terminal sessions and the links that share a live session or a recording: an app of its own
that owns its models, actions, the owner worker's recorder, the store, pages, the shared socket and the admin.
Other apps reach it through ``recordings.actions`` (and the worker through ``recordings.recorder``)."""
