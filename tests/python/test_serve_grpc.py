"""`convnets serve`'s gRPC service through tritonclient.grpc, unmodified: every RPC beside its HTTP answer, images
and tensors as over HTTP, the limits, 10^5 requests, and the drain.

Every server listens on 127.0.0.1 only, on a port it picks, and is stopped by the test that started it.
"""
import json
import os
import signal
import struct
import subprocess
import tempfile
import threading
import time
import unittest
import urllib.request

import fixtures  # the suite's shared trained network (tests/python/fixtures.py)

import numpy as np
import grpc
import tritonclient.grpc as tritongrpc
import tritonclient.http as triton
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException, serialize_byte_tensor

from serve_harness import Serve, convnets, image_input, pixel_input, post, read, started, tensor_input


class GrpcService(unittest.TestCase):
    """Triton's gRPC service (`--grpc-port`) through tritonclient.grpc, unmodified (issue 60): every RPC beside its
    HTTP answer, images and tensors as over HTTP, the limits, 10^5 requests, and the drain."""

    @classmethod
    def setUpClass(cls):
        cls.ckpt = fixtures.fashion_resnet8()
        cls.server = Serve(f"fashion={cls.ckpt}", "--max-batch-size", "16")
        cls.addClassCleanup(cls.server.stop)  # also where the rest of setUpClass fails
        cls.grpc = tritongrpc.InferenceServerClient(cls.server.grpc_url)

    @classmethod
    def tearDownClass(cls):
        cls.grpc.close()
        assert cls.server.stop() == 0, cls.server.stderr

    def code(self, call):
        with self.assertRaises(InferenceServerException) as e:
            call()
        return e.exception.status(), e.exception.message()

    def test_every_rpc_answers_as_http(self):
        g, h = self.grpc, self.server.client
        self.assertTrue(g.is_server_live())
        self.assertTrue(g.is_server_ready())
        self.assertTrue(g.is_model_ready("fashion"))
        self.assertTrue(g.is_model_ready("fashion", "1"))
        self.assertFalse(g.is_model_ready("absent"))
        self.assertFalse(g.is_model_ready("fashion", "2"))
        meta, http_meta = g.get_server_metadata(as_json=True), h.get_server_metadata()
        self.assertEqual((meta["name"], meta["version"], meta["extensions"]),
                         (http_meta["name"], http_meta["version"], http_meta["extensions"]))
        shaped = lambda ts: [(t["name"], t["datatype"], [int(d) for d in t["shape"]]) for t in ts]  # noqa: E731
        mm, hmm = g.get_model_metadata("fashion", as_json=True), h.get_model_metadata("fashion")
        self.assertEqual((mm["name"], mm["versions"], mm["platform"]), (hmm["name"], hmm["versions"], hmm["platform"]))
        self.assertEqual(shaped(mm["inputs"]), shaped(hmm["inputs"]))
        self.assertEqual(shaped(mm["outputs"]), shaped(hmm["outputs"]))
        config, http_config = g.get_model_config("fashion", as_json=True)["config"], h.get_model_config("fashion")
        self.assertEqual(int(config["max_batch_size"]), http_config["max_batch_size"])
        for key in ("input", "output"):
            self.assertEqual([(t["name"], t["data_type"], [int(d) for d in t["dims"]]) for t in config[key]],
                             [(t["name"], t["data_type"], t["dims"]) for t in http_config[key]])
        self.assertEqual({k: v["string_value"] for k, v in config["parameters"].items()},
                         {k: v["string_value"] for k, v in http_config["parameters"].items()})
        self.assertEqual(config["instance_group"][0]["kind"], http_config["instance_group"][0]["kind"])
        # The JSON is Triton's ModelConfig, field for field (deploy/triton_config.h writes it and config.pbtxt).
        from google.protobuf import json_format
        from tritonclient.grpc import model_config_pb2
        parsed = json_format.ParseDict(http_config, model_config_pb2.ModelConfig())
        self.assertEqual((parsed.dynamic_batching.default_queue_policy.max_queue_size, parsed.instance_group[0].count),
                         (64, 1))
        self.assertEqual(g.get_model_repository_index(as_json=True)["models"],
                         [{"name": "fashion", "version": "1", "state": "READY"}])
        status, message = self.code(lambda: g.get_model_metadata("absent"))
        self.assertEqual(status, "StatusCode.NOT_FOUND")
        self.assertIn("'absent' is not found", message)
        status, message = self.code(lambda: g.get_model_config("fashion", "2"))
        self.assertEqual(status, "StatusCode.NOT_FOUND")
        self.assertIn("version 1 is served", message)

    def test_the_proto_is_wire_compatible_with_tritonclient(self):
        # src/kserve/triton_grpc.proto, compiled by protoc (what the build compiles), field by field against the
        # descriptors tritonclient.grpc itself installs: numbers, types, repetition, enum values, and each RPC's
        # request and response types. protoc comes with scripts/setup.sh (protobuf-compiler).
        from google.protobuf import descriptor_pb2, descriptor_pool
        proto = os.path.join(os.environ["CONVNETS_SOURCE_DIR"], "src", "kserve", "triton_grpc.proto")
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "set.pb")
            r = subprocess.run(["protoc", "--descriptor_set_out=" + out, "-I", os.path.dirname(proto), proto],
                               capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, r.stderr)
            files = descriptor_pb2.FileDescriptorSet()
            files.ParseFromString(read(out))
        ours = descriptor_pool.DescriptorPool()
        for f in files.file:
            ours.Add(f)
        theirs = descriptor_pool.Default()  # tritonclient.grpc's service_pb2 and model_config_pb2, imported above
        problems = []

        def compare(mine, their, path):
            for f in mine.fields:
                t = their.fields_by_name.get(f.name)
                if t is None:
                    problems.append(f"{path}.{f.name}: not in tritonclient's {their.full_name}")
                    continue
                if (f.number, f.type, f.is_repeated) != (t.number, t.type, t.is_repeated):
                    problems.append(f"{path}.{f.name}: ({f.number}, {f.type}, {f.is_repeated}) against tritonclient's "
                                    f"({t.number}, {t.type}, {t.is_repeated})")
                if f.message_type and t.message_type:
                    compare(f.message_type, t.message_type, path + "." + f.name)
                if f.enum_type and t.enum_type:
                    values = {v.name: v.number for v in t.enum_type.values}
                    problems.extend(f"{path}.{f.name}: {v.name} = {v.number}, tritonclient's {values.get(v.name)}"
                                    for v in f.enum_type.values if values.get(v.name) != v.number)

        service = ours.FindServiceByName("inference.GRPCInferenceService")
        their_service = theirs.FindServiceByName("inference.GRPCInferenceService")
        for m in service.methods:
            t = their_service.methods_by_name.get(m.name)
            if t is None:
                problems.append(f"rpc {m.name}: not in tritonclient's service")
                continue
            for mine, their in ((m.input_type, t.input_type), (m.output_type, t.output_type)):
                self.assertEqual(mine.full_name, their.full_name, m.name)
                compare(mine, their, mine.full_name)
        self.assertEqual(problems, [])
        self.assertEqual(len(service.methods), 13)

    def test_tensors_give_the_package_logits(self):
        import convnets  # the package: classify's InferenceModel, its engine chosen as classify chooses it
        import torch
        model = convnets.load(self.ckpt, device="cpu")
        x = np.random.default_rng(11).standard_normal((5, 3, 28, 28)).astype(np.float32)
        expected = model(torch.from_numpy(x)).numpy()
        t = tritongrpc.InferInput("input", list(x.shape), "FP32")
        t.set_data_from_numpy(x)  # raw_input_contents, as tritonclient.grpc sends
        np.testing.assert_allclose(self.grpc.infer("fashion", [t]).as_numpy("logits"), expected, rtol=0, atol=1e-5)
        # The protocol's typed contents, which tritonclient never sends: through the generated stub.
        stub = service_pb2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(self.server.grpc_url))
        request = service_pb2.ModelInferRequest(model_name="fashion", id="typed")
        typed = request.inputs.add(name="input", datatype="FP32", shape=list(x.shape))
        typed.contents.fp32_contents.extend(x.ravel().tolist())
        response = stub.ModelInfer(request, timeout=60)
        self.assertEqual((response.model_name, response.id, response.outputs[0].name), ("fashion", "typed", "logits"))
        self.assertEqual(list(response.outputs[0].shape), [5, 10])
        np.testing.assert_allclose(np.frombuffer(response.raw_output_contents[0], np.float32).reshape(5, 10), expected,
                                   rtol=0, atol=1e-5)
        pixels = np.random.default_rng(12).integers(0, 256, (2, 28, 28, 3), dtype=np.uint8)
        p = tritongrpc.InferInput("PIXELS", list(pixels.shape), "UINT8")
        p.set_data_from_numpy(pixels)
        np.testing.assert_allclose(self.grpc.infer("fashion", [p]).as_numpy("logits"),
                                   model(torch.from_numpy(pixels)).numpy(), rtol=0, atol=1e-5)
        # The classification extension: the same strings as over HTTP.
        out = self.grpc.infer("fashion", [t], outputs=[tritongrpc.InferRequestedOutput("logits", class_count=3)])
        http_out = self.server.client.infer("fashion", [tensor_input(x)],
                                            outputs=[triton.InferRequestedOutput("logits", class_count=3)])
        self.assertEqual(out.as_numpy("logits").tolist(), http_out.as_numpy("logits").tolist())

    def test_jpeg_bytes_give_classify_top1(self):
        files = fixtures.imagenet_like_jpegs(100)
        r = convnets("classify", *files, "--checkpoint", self.ckpt, "--json", "--top-k", "1")
        self.assertEqual(r.returncode, 0, r.stderr)
        expected = [x["top"][0]["index"] for x in json.loads(r.stdout)["results"]]
        got = []
        for i in range(0, len(files), 16):
            batch = files[i:i + 16]
            t = tritongrpc.InferInput("INPUT", [len(batch), 1], "BYTES")
            t.set_data_from_numpy(np.array([[read(p)] for p in batch], dtype=np.object_))
            out = self.grpc.infer("fashion", [t], outputs=[tritongrpc.InferRequestedOutput("logits", class_count=1)])
            got += [int(row[0].decode().split(":")[1]) for row in out.as_numpy("logits")]
        self.assertEqual(got, expected)
        self.assertGreater(len(set(got)), 1)

    def test_the_request_checks_answer_alike_over_both_protocols(self):
        # Each check of a request's own fields is written once (kserve/messages.h): the same message over HTTP and gRPC,
        # HTTP's status and gRPC's code for it. Sent raw (a JSON body; the generated stub), as no client stops them.
        stub = service_pb2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(self.server.grpc_url))
        one = {"name": "input", "datatype": "FP32", "shape": [1], "data": [0.5]}

        def typed(request, n):
            for i in range(n):
                t = request.inputs.add(name=f"in{i}", datatype="FP32", shape=[1])
                t.contents.fp32_contents.append(0.5)
            return request

        negative_timeout = typed(service_pb2.ModelInferRequest(model_name="fashion"), 1)
        negative_timeout.parameters["timeout"].int64_param = -1
        negative_k = typed(service_pb2.ModelInferRequest(model_name="fashion"), 1)
        negative_k.outputs.add(name="logits").parameters["classification"].int64_param = -2
        many_outputs = typed(service_pb2.ModelInferRequest(model_name="fashion"), 1)
        for i in range(17):
            many_outputs.outputs.add(name=f"out{i}")
        cases = [
            ({"inputs": []}, service_pb2.ModelInferRequest(model_name="fashion"),
             400, "StatusCode.INVALID_ARGUMENT", "the request has no inputs"),
            ({"inputs": [dict(one, name=f"in{i}") for i in range(17)]},
             typed(service_pb2.ModelInferRequest(model_name="fashion"), 17),
             413, "StatusCode.RESOURCE_EXHAUSTED", "17 inputs, over the limit of 16"),
            ({"inputs": [one], "parameters": {"timeout": -1}}, negative_timeout,
             400, "StatusCode.INVALID_ARGUMENT", 'parameter "timeout" must be 0 or more microseconds'),
            ({"inputs": [one], "outputs": [{"name": f"out{i}"} for i in range(17)]}, many_outputs,
             413, "StatusCode.RESOURCE_EXHAUSTED", "17 outputs requested, over the limit of 16"),
            ({"inputs": [one], "outputs": [{"name": "logits", "parameters": {"classification": -2}}]}, negative_k,
             400, "StatusCode.INVALID_ARGUMENT", "output 'logits': classification must be 0 or more"),
        ]
        for body, message, http_status, grpc_code, text in cases:
            status, answer = post(self.server.port, "/v2/models/fashion/infer", json.dumps(body).encode())
            self.assertEqual((status, json.loads(answer)["error"]), (http_status, text), body)
            with self.assertRaises(grpc.RpcError) as e:
                stub.ModelInfer(message, timeout=60)
            self.assertEqual((str(e.exception.code()), e.exception.details()), (grpc_code, text))

    def test_bad_requests_are_refused_by_name(self):
        x = np.zeros((1, 3, 28, 28), np.int32)
        t = tritongrpc.InferInput("input", list(x.shape), "INT32")
        t.set_data_from_numpy(x)
        status, message = self.code(lambda: self.grpc.infer("fashion", [t]))
        self.assertEqual(status, "StatusCode.INVALID_ARGUMENT")
        self.assertIn("input 'input': expected datatype FP32, got INT32", message)
        jpeg = read(fixtures.imagenet_like_jpegs(1)[0])
        b = tritongrpc.InferInput("INPUT", [1, 1], "BYTES")
        b.set_data_from_numpy(np.array([[jpeg[:len(jpeg) // 3]]], dtype=np.object_))
        status, message = self.code(lambda: self.grpc.infer("fashion", [b]))
        self.assertEqual(status, "StatusCode.INVALID_ARGUMENT")
        self.assertIn("INPUT[0]: truncated JPEG", message)
        f = tritongrpc.InferInput("input", [1, 3, 28, 28], "FP32")
        f.set_data_from_numpy(np.zeros((1, 3, 28, 28), np.float32))
        status, message = self.code(lambda: self.grpc.infer("absent", [f]))
        self.assertEqual(status, "StatusCode.NOT_FOUND")
        self.assertIn("'absent' is not found", message)
        self.assertEqual(self.grpc.infer("fashion", [f]).as_numpy("logits").shape, (1, 10))

    def test_inputs_from_system_shared_memory(self):
        # Triton's system shared-memory extension, the way perf_analyzer --shared-memory system and tritonclient's
        # utilities use it: the client writes a tensor and a JPEG into one POSIX shared-memory object, registers it
        # over either protocol (one registry), and each request names a range of it instead of carrying the bytes.
        import tritonclient.utils.shared_memory as shm
        h, g = self.server.client, self.grpc
        x = np.random.default_rng(21).standard_normal((3, 3, 28, 28)).astype(np.float32)
        expected = h.infer("fashion", [tensor_input(x)]).as_numpy("logits")
        jpeg_path = fixtures.imagenet_like_jpegs(1)[0]
        # Triton's BYTES element as its shared-memory clients write it: a 4-byte length, then the bytes.
        jpeg = serialize_byte_tensor(np.array([[read(jpeg_path)]], dtype=np.object_))
        jpeg_top1 = h.infer("fashion", [image_input([jpeg_path])]).as_numpy("logits").argmax(1)
        jpeg_bytes = len(jpeg.item())
        key = f"/convnets-test-{os.getpid()}"
        size = 64 + x.nbytes + jpeg_bytes
        region = shm.create_shared_memory_region("in", key, size)
        try:
            shm.set_shared_memory_region(region, [x], offset=64)
            shm.set_shared_memory_region(region, [jpeg], offset=64 + x.nbytes)
            for register, client, module in ((h.register_system_shared_memory, h, triton),
                                             (g.register_system_shared_memory, g, tritongrpc)):
                register("in", key, size)
                t = module.InferInput("input", list(x.shape), "FP32")
                t.set_shared_memory("in", x.nbytes, offset=64)
                np.testing.assert_allclose(client.infer("fashion", [t]).as_numpy("logits"), expected, rtol=0, atol=1e-5)
                b = module.InferInput("INPUT", [1, 1], "BYTES")
                b.set_shared_memory("in", jpeg_bytes, offset=64 + x.nbytes)
                self.assertEqual(client.infer("fashion", [b]).as_numpy("logits").argmax(1).tolist(), jpeg_top1.tolist())
                # One registry: what one protocol registered, the other lists.
                self.assertEqual(h.get_system_shared_memory_status(),
                                 [{"name": "in", "key": key, "offset": 0, "byte_size": size}])
                status = g.get_system_shared_memory_status(as_json=True)["regions"]["in"]
                self.assertEqual((status["name"], status["key"], int(status["byte_size"])), ("in", key, size))
                # A range past the region, an output asked into it, a second registration, a range past the object,
                # a key that does not exist, a region unregistered: refused by name.
                past = module.InferInput("input", list(x.shape), "FP32")
                past.set_shared_memory("in", x.nbytes, offset=size - x.nbytes + 4)
                with self.assertRaises(InferenceServerException) as e:
                    client.infer("fashion", [past])
                self.assertIn("input 'input': shared_memory_offset", e.exception.message())
                self.assertIn(f"is past the end of shared memory region 'in' ({size} bytes)", e.exception.message())
                huge = module.InferInput("input", list(x.shape), "FP32")
                huge.set_shared_memory("in", 1 << 30)  # a range no body could carry: bounded as a body is
                with self.assertRaises(InferenceServerException) as e:
                    client.infer("fashion", [huge])
                self.assertIn("shared_memory_byte_size 1073741824 is over the limit of", e.exception.message())
                out = module.InferRequestedOutput("logits")
                out.set_shared_memory("in", 40 * 3)
                with self.assertRaises(InferenceServerException) as e:
                    client.infer("fashion", [t], outputs=[out])
                self.assertIn("output 'logits': outputs are not written into shared memory", e.exception.message())
                with self.assertRaises(InferenceServerException) as e:
                    register("in", key, size)
                self.assertIn("shared memory region 'in' is already registered", e.exception.message())
                with self.assertRaises(InferenceServerException) as e:
                    register("more", key, size + 1)
                self.assertIn(f"offset 0 + byte_size {size + 1} is past the end of '{key}' ({size} bytes)",
                              e.exception.message())
                with self.assertRaises(InferenceServerException) as e:
                    register("absent", key + "-absent", 8)
                self.assertIn(f"cannot open the shared memory object '{key}-absent'", e.exception.message())
                client.unregister_system_shared_memory("in")
                with self.assertRaises(InferenceServerException) as e:
                    client.infer("fashion", [t])
                self.assertIn("input 'input': shared memory region 'in' is not registered", e.exception.message())
                self.assertEqual(h.get_system_shared_memory_status(), [])
            self.assertIn("system_shared_memory", h.get_server_metadata()["extensions"])
            # tritonclient quote()s a region's name into the URL (a space as %20); the request's JSON names it as is.
            h.register_system_shared_memory("in two", key, size)
            self.assertEqual([r["name"] for r in h.get_system_shared_memory_status("in two")], ["in two"])
            t = triton.InferInput("input", list(x.shape), "FP32")
            t.set_shared_memory("in two", x.nbytes, offset=64)
            np.testing.assert_allclose(h.infer("fashion", [t]).as_numpy("logits"), expected, rtol=0, atol=1e-5)
            h.unregister_system_shared_memory("in two")
            self.assertEqual(h.get_system_shared_memory_status(), [])
        finally:
            h.unregister_system_shared_memory()
            shm.destroy_shared_memory_region(region)

    def test_regions_registered_at_an_offset_are_read_from_it(self):
        # A region registered at an offset that is not a page's and one whose offset lies in the object's last page:
        # each input read from its region's own bytes, the object around them filled with other numbers, so a read
        # that dropped the region's offset (or an input's within it) gets those.
        import tritonclient.utils.shared_memory as shm
        h, g = self.server.client, self.grpc
        page = os.sysconf("SC_PAGE_SIZE")
        x = np.random.default_rng(31).standard_normal((1, 3, 28, 28)).astype(np.float32)
        pixels = np.random.default_rng(32).integers(0, 256, (1, 28, 28, 3), dtype=np.uint8)  # 2,352 bytes: fits a page
        want_x = h.infer("fashion", [tensor_input(x)]).as_numpy("logits")
        want_p = h.infer("fashion", [pixel_input(pixels)]).as_numpy("logits")
        total = 6 * page
        at = 100 + page  # neither page-aligned nor in the first page
        last = 5 * page + 700  # in the last page, the pixels ending before its end
        key = f"/convnets-test-offset-{os.getpid()}"
        region = shm.create_shared_memory_region("whole", key, total)
        try:
            shm.set_shared_memory_region(region, [np.full(total // 4, 7.5, np.float32)])
            shm.set_shared_memory_region(region, [x], offset=at)
            shm.set_shared_memory_region(region, [pixels], offset=last)
            for client, module in ((h, triton), (g, tritongrpc)):
                client.register_system_shared_memory("at", key, x.nbytes, offset=at)
                client.register_system_shared_memory("last", key, pixels.nbytes, offset=last)
                t = module.InferInput("input", list(x.shape), "FP32")
                t.set_shared_memory("at", x.nbytes)
                np.testing.assert_allclose(client.infer("fashion", [t]).as_numpy("logits"), want_x, rtol=0, atol=1e-5)
                p = module.InferInput("PIXELS", list(pixels.shape), "UINT8")
                p.set_shared_memory("last", pixels.nbytes)
                np.testing.assert_allclose(client.infer("fashion", [p]).as_numpy("logits"), want_p, rtol=0, atol=1e-5)
                client.unregister_system_shared_memory()
        finally:
            h.unregister_system_shared_memory()
            shm.destroy_shared_memory_region(region)

    def test_an_object_shrunk_after_registration_fails_its_requests_not_the_server(self):
        # A client truncates its object below a registered range (a bug, or a hostile client): the server reads
        # regions through a descriptor, so the next request over either protocol is refused naming the region and
        # its key, where a mapping would have died of SIGBUS; other clients' requests go on being answered.
        import tritonclient.utils.shared_memory as shm
        h, g = self.server.client, self.grpc
        x = np.random.default_rng(41).standard_normal((1, 3, 28, 28)).astype(np.float32)
        want = h.infer("fashion", [tensor_input(x)]).as_numpy("logits")
        size = 2 * os.sysconf("SC_PAGE_SIZE") + x.nbytes
        key = f"/convnets-test-shrunk-{os.getpid()}"
        region = shm.create_shared_memory_region("shrunk", key, size)
        try:
            shm.set_shared_memory_region(region, [x], offset=size - x.nbytes)
            h.register_system_shared_memory("shrunk", key, size)
            t = triton.InferInput("input", list(x.shape), "FP32")
            t.set_shared_memory("shrunk", x.nbytes, offset=size - x.nbytes)
            np.testing.assert_allclose(h.infer("fashion", [t]).as_numpy("logits"), want, rtol=0, atol=1e-5)
            os.truncate("/dev/shm" + key, 100)
            for client, module in ((h, triton), (g, tritongrpc)):
                t = module.InferInput("input", list(x.shape), "FP32")
                t.set_shared_memory("shrunk", x.nbytes, offset=size - x.nbytes)
                with self.assertRaises(InferenceServerException) as e:
                    client.infer("fashion", [t])
                self.assertIn("input 'input': shared memory region 'shrunk' ends 0 bytes into the "
                              f"{x.nbytes} asked: its object '{key}' was shrunk after it was registered",
                              e.exception.message())
                self.assertEqual(e.exception.status(), "400" if client is h else "StatusCode.INVALID_ARGUMENT")
                inline = module.InferInput("input", list(x.shape), "FP32")
                inline.set_data_from_numpy(x)
                np.testing.assert_allclose(client.infer("fashion", [inline]).as_numpy("logits"), want, rtol=0, atol=1e-5)
            self.assertTrue(h.is_server_live())
        finally:
            h.unregister_system_shared_memory()
            shm.destroy_shared_memory_region(region)

    def test_a_large_copy_out_of_a_region_leaves_the_event_loop_free(self):
        # A request naming 60 MB of a region is copied out on a worker: while two clients send such requests back
        # to back, the loop that every connection shares answers a health check in a fraction of one copy's time.
        import tritonclient.utils.shared_memory as shm
        size = 60 << 20
        key = f"/convnets-test-large-{os.getpid()}"
        region = shm.create_shared_memory_region("large", key, size + 4)
        body = json.dumps({"inputs": [{"name": "INPUT", "datatype": "BYTES", "shape": [1, 1], "parameters": {
            "shared_memory_region": "large", "shared_memory_byte_size": size + 4}}]}).encode()
        try:
            shm.set_shared_memory_region(region, [np.frombuffer(struct.pack("<I", size), np.uint8),
                                                  np.full(size, 1, np.uint8)])
            self.server.client.register_system_shared_memory("large", key, size + 4)
            copies = []  # each copy's time, taken while the health checks are: the same seconds, the same machine

            def large():
                t0 = time.perf_counter()
                status, text = post(self.server.port, "/v2/models/fashion/infer", body)
                self.assertEqual(status, 400, text)  # copied, then found not to be an image
                copies.append(time.perf_counter() - t0)
            stop = threading.Event()

            def flood():
                while not stop.is_set():
                    large()
            threads = [threading.Thread(target=flood) for _ in range(2)]
            for t in threads:
                t.start()
            health = []
            try:
                time.sleep(0.2)
                for _ in range(30):
                    t0 = time.perf_counter()
                    with urllib.request.urlopen(f"http://{self.server.url}/v2/health/live", timeout=30) as r:
                        self.assertEqual(r.status, 200)
                    health.append(time.perf_counter() - t0)
                    time.sleep(0.02)
            finally:
                stop.set()
                for t in threads:
                    t.join()
            median = sorted(health)[len(health) // 2]
            copy = sorted(copies)[len(copies) // 2]
            self.assertGreaterEqual(len(copies), 4, "too few copies ran beside the health checks to compare them")
            self.assertLess(median, 0.25 * copy, f"a health check took {1e3 * median:.1f} ms while 60 MB copies "
                                                 f"ran, each {1e3 * copy:.1f} ms: the copies hold the event loop")
        finally:
            self.server.client.unregister_system_shared_memory("large")
            shm.destroy_shared_memory_region(region)

    def test_a_message_over_the_limit_is_resource_exhausted(self):
        server = started(self, f"fashion={self.ckpt}", "--max-request-bytes", "65536")
        try:
            client = tritongrpc.InferenceServerClient(server.grpc_url)
            big = tritongrpc.InferInput("input", [8, 3, 28, 28], "FP32")  # 75 KB of raw contents
            big.set_data_from_numpy(np.zeros((8, 3, 28, 28), np.float32))
            status, message = self.code(lambda: client.infer("fashion", [big]))
            self.assertEqual(status, "StatusCode.RESOURCE_EXHAUSTED", message)
            small = tritongrpc.InferInput("input", [1, 3, 28, 28], "FP32")
            small.set_data_from_numpy(np.zeros((1, 3, 28, 28), np.float32))
            self.assertEqual(client.infer("fashion", [small]).as_numpy("logits").shape, (1, 10))
            client.close()
        finally:
            self.assertEqual(server.stop(), 0)

    def test_a_hundred_thousand_requests_at_concurrency_16(self):
        key = '{model="fashion",version="1"}'
        before = self.server.metrics()["nv_inference_request_success" + key]
        pixels = np.random.default_rng(13).integers(0, 256, (1, 28, 28, 3), dtype=np.uint8)
        outcomes, lock = {}, threading.Lock()

        def client(n):
            c = tritongrpc.InferenceServerClient(self.server.grpc_url)
            p = tritongrpc.InferInput("PIXELS", list(pixels.shape), "UINT8")
            p.set_data_from_numpy(pixels)
            mine = {}
            for _ in range(n):
                try:
                    c.infer("fashion", [p], client_timeout=60)
                    kind = "ok"
                except InferenceServerException as e:
                    kind = str(e.status())
                mine[kind] = mine.get(kind, 0) + 1
            c.close()
            with lock:
                for k, v in mine.items():
                    outcomes[k] = outcomes.get(k, 0) + v

        threads = [threading.Thread(target=client, args=(100000 // 16,)) for _ in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        self.assertEqual(outcomes, {"ok": 100000})
        self.assertEqual(self.server.metrics()["nv_inference_request_success" + key] - before, 100000)

    def test_sigterm_during_load_answers_every_request_read(self):
        server = started(self, f"fashion={self.ckpt}", "--max-batch-size", "8")
        x = np.zeros((1, 3, 28, 28), np.float32)
        outcomes, lock, stop = [], threading.Lock(), time.monotonic() + 30

        def client():
            c = tritongrpc.InferenceServerClient(server.grpc_url)
            t = tritongrpc.InferInput("input", list(x.shape), "FP32")
            t.set_data_from_numpy(x)
            while time.monotonic() < stop:
                try:
                    c.infer("fashion", [t], client_timeout=30)
                    outcome = ("ok", "")
                except InferenceServerException as e:
                    outcome = (str(e.status()), e.message() or "")
                with lock:
                    outcomes.append(outcome)
                if outcome[0] != "ok":
                    break
            c.close()

        threads = [threading.Thread(target=client) for _ in range(8)]
        for t in threads:
            t.start()
        time.sleep(1.5)
        server.proc.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(60)
        self.assertEqual(server.stop(), 0, server.stderr)
        ok = sum(1 for o in outcomes if o[0] == "ok")
        self.assertGreater(ok, 100)
        # Every request the server ran was answered: its own count of results (the line it ends with) is what the
        # clients received. The others were refused, never run: 503's UNAVAILABLE "shutting down" while it
        # drained; then, racing the service's stop, a call gRPC itself turns away (CANCELLED) or finds no one to
        # connect to (UNAVAILABLE). Nothing else: no internal error, no reset.
        self.assertIn("convnets serve: stopped (fashion: %d succeeded, 0 failed)" % ok, server.stderr)
        for status, message in outcomes:
            if status == "StatusCode.UNAVAILABLE":
                self.assertTrue("shutting down" in message or "connect" in message.lower(), message)
            elif status != "ok":
                self.assertEqual(status, "StatusCode.CANCELLED", message)
        self.assertIn("SIGTERM: draining", server.stderr)


if __name__ == "__main__":
    unittest.main()
