"""What an HTTP process runs beside its routes (`server.api`, which keeps only the routes and
what maps requests and errors to HTTP): its HTTP protocol (`httpproto`), its thread pool
(`threadpool`), its event loop's lag probe (`looplag`) and its reports to, and view of, the
other HTTP processes of the host (`siblings`). The manager that starts those processes is
`server.http_processes`."""
