import socket, sys, time, threading
srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("127.0.0.1", int(sys.argv[1]))); srv.listen(64)
held = []
while True:
    c, _ = srv.accept(); held.append(c)
