"""The ``stampd`` command: the client's commands (`client.cli`) and, where the server is
installed (``pip install 'stampd[server]'``), the server's (`server.commands`)."""
