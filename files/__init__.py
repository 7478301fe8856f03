"""Files in and out of a workspace (docs/api.md, Files): list a directory, download a file, upload a file or a
tar, on docker and host machines a person may use, inside the paths the machine allows.

The bytes never pass through a web process whole: the web process streams them to or from the worker that
serves the machine (the one that runs its shells: on its host, or with its docker engine), a chunk at a time
over the channel layer, each chunk answered before the next is sent. The worker moves them with small
programs run on the machine itself, as the machine's shells run (the container's own user, the worker's user
on a host): what a person could not read or write from their shell, they cannot through here either."""
