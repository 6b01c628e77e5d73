"""TLS inside one polymux channel, plain bytes in another, over one TCP connection (anyio).

python examples/anyio_tls.py [--backend trio]

A server and a client run in this process on 127.0.0.1, speaking yamux. Each channel
starts with one byte saying what it carries: b"T" then TLS (anyio's own TLSStream,
unmodified, on top of the channel), or b"P" then plain bytes. The server answers TLS
messages in upper case and echoes plain ones. The self-signed certificate for "localhost"
is made at start, with the cryptography package if it is installed, else with the
openssl command.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import shutil
import ssl
import subprocess
import sys
import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path

import anyio
from anyio.abc import ByteStream, SocketAttribute
from anyio.streams.tls import TLSAttribute, TLSStream

import polymux.anyio
from polymux.anyio import AnyioChannel, ChannelAttribute


def write_certificate(cert: Path, key: Path) -> None:
    """A self-signed certificate for "localhost", valid for a day."""
    if importlib.util.find_spec("cryptography") is not None:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID

        private = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
        now = datetime.now(UTC)
        certificate = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(private.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - timedelta(minutes=5))
            .not_valid_after(now + timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(private, hashes.SHA256())
        )
        cert.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
        key.write_bytes(
            private.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
        print("certificate: made with the cryptography package")
    elif openssl := shutil.which("openssl"):
        request = "req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1"
        request += " -subj /CN=localhost -addext subjectAltName=DNS:localhost"
        command = [openssl, *request.split(), "-keyout", str(key), "-out", str(cert)]
        subprocess.run(command, check=True, capture_output=True, timeout=60)
        print("certificate: made with the openssl command")
    else:
        sys.exit("this example needs the cryptography package or the openssl command to make a certificate")


def tls_contexts() -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """(server context, client context) for a fresh certificate."""
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    client = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    with tempfile.TemporaryDirectory() as folder:
        cert, key = Path(folder) / "cert.pem", Path(folder) / "key.pem"
        write_certificate(cert, key)
        server.load_cert_chain(cert, key)
        client.load_verify_locations(cert)
    return server, client


async def receive_all(stream: ByteStream) -> bytes:
    data = b""
    async for chunk in stream:  # until the peer's end (EndOfStream)
        data += chunk
    return data


# -- the server ---------------------------------------------------------------------------------


async def serve_channel(context: ssl.SSLContext, channel: AnyioChannel) -> None:
    label = channel.extra(ChannelAttribute.channel)
    if await channel.receive(1) == b"T":
        async with await TLSStream.wrap(channel, server_side=True, ssl_context=context) as tls:
            print(f"[server] {label}: TLS ({tls.extra(TLSAttribute.tls_version)})")
            async for message in tls:  # until the client's close_notify
                print(f"[server] {label}: decrypted {message!r}")
                await tls.send(message.upper())
    else:
        print(f"[server] {label}: plain")
        async for data in channel:
            await channel.send(data)
        await channel.send_eof()


async def serve_connection(context: ssl.SSLContext, stream: ByteStream) -> None:
    async with (
        polymux.anyio.session(stream, protocol="yamux", is_client=False) as mux,
        anyio.create_task_group() as tg,
    ):
        async for channel in mux:
            tg.start_soon(serve_channel, context, channel)


# -- the client ---------------------------------------------------------------------------------


async def talk_tls(mux: polymux.anyio.AnyioSession, context: ssl.SSLContext) -> None:
    channel = await mux.open_channel("tls")
    await channel.send(b"T")
    async with await TLSStream.wrap(channel, hostname="localhost", ssl_context=context) as tls:
        cipher = tls.extra(TLSAttribute.cipher)[0]
        print(f"[client] tls channel: {tls.extra(TLSAttribute.tls_version)}, {cipher}")
        await tls.send(b"hello over tls")
        print(f"[client] tls channel: answer {await tls.receive()!r}")


async def talk_plain(mux: polymux.anyio.AnyioSession) -> None:
    channel = await mux.open_channel("plain")
    await channel.send(b"P")
    await channel.send(b"hello in the clear")
    await channel.send_eof()
    print(f"[client] plain channel: echo {await receive_all(channel)!r}")
    await channel.aclose()


async def main(backend: str, server_context: ssl.SSLContext, client_context: ssl.SSLContext) -> None:
    async with (
        await anyio.create_tcp_listener(local_host="127.0.0.1") as listener,
        anyio.create_task_group() as server,
    ):
        port = listener.extra(SocketAttribute.local_port)
        server.start_soon(listener.serve, functools.partial(serve_connection, server_context))
        print(f"server: yamux on 127.0.0.1:{port} (anyio on {backend})")

        stream = await anyio.connect_tcp("127.0.0.1", port)
        async with polymux.anyio.session(stream, protocol="yamux") as mux, anyio.create_task_group() as tg:
            tg.start_soon(talk_tls, mux, client_context)  # both channels at once,
            tg.start_soon(talk_plain, mux)  # on one connection
        print("client: done, both channels closed")
        server.cancel_scope.cancel()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=["asyncio", "trio"], default="asyncio")
    args = parser.parse_args()
    anyio.run(main, args.backend, *tls_contexts(), backend=args.backend)
