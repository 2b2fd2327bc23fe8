// An independent gRPC client for the appliance: @grpc/grpc-js + @grpc/proto-loader (tests/test_interop_node.py).
// Usage: node client.js TARGET REPO_ROOT DICOM_FILE
// Prints one JSON object: health statuses, an Analyze reply, and the status of an Analyze on non-DICOM bytes.
'use strict';
const fs = require('fs');
const path = require('path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');
const healthCheck = require('grpc-health-check');

const [target, repo, dicomFile] = process.argv.slice(2);
const options = { keepCase: true, longs: String, enums: String, defaults: true, oneofs: true };
const appliance = grpc.loadPackageDefinition(
  protoLoader.loadSync(path.join(repo, 'appliance/proto/v1/inference.proto'), { ...options, includeDirs: [repo] }),
).appliance.v1;
const health = grpc.loadPackageDefinition(protoLoader.loadSync(healthCheck.protoPath, options)).grpc.health.v1;

const deadline = () => new Date(Date.now() + 20000);
const call = (client, method, request) =>
  new Promise((resolve) => {
    client[method](request, { deadline: deadline() }, (err, reply) => resolve({ err, reply }));
  });

async function main() {
  const creds = grpc.credentials.createInsecure();
  const healthClient = new health.Health(target, creds);
  const inference = new appliance.Inference(target, creds);
  const out = { health: {} };
  for (const service of ['', 'appliance.v1.Inference', 'no.such.Service']) {
    const { err, reply } = await call(healthClient, 'Check', { service });
    out.health[service] = err ? { code: err.code, details: err.details } : reply.status;
  }
  const dicom = fs.readFileSync(dicomFile);
  const ok = await call(inference, 'Analyze', { dicom, request_id: 'node-1', priority: 'INTERACTIVE' });
  out.analyze = ok.err ? { code: ok.err.code, details: ok.err.details } : ok.reply;
  const bad = await call(inference, 'Analyze', { dicom: Buffer.from('not a dicom file'), request_id: 'node-2' });
  out.bad = bad.err
    ? { code: bad.err.code, details: bad.err.details, rich: bad.err.metadata.get('grpc-status-details-bin').length > 0 }
    : { unexpected: bad.reply };
  healthClient.close();
  inference.close();
  process.stdout.write(JSON.stringify(out) + '\n');
}

main().catch((e) => {
  process.stderr.write(String(e && e.stack ? e.stack : e) + '\n');
  process.exit(1);
});
