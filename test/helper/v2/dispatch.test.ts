/** The request table and dispatch, without sockets: one handler per request type, the right one called. */
import { describe, expect, it } from 'vitest';
import { dispatch, HANDLERS } from '../../../src/helper/v2/requests/table.js';
import type { HandlerTable, RequestType } from '../../../src/helper/v2/requests/handler.js';
import { CLIENT_TYPES, T, encodeU32Frame } from '../../../src/protocol/v2/codec.js';
import type { ClientRequest } from '../../../src/protocol/v2/messages.js';

describe('dispatch', () => {
  it('calls the handler of the request type with the request, the connection and the parts, and returns its reply', () => {
    const calls: [RequestType, unknown, string, string][] = [];
    const handler = (type: RequestType) => (req: ClientRequest, conn: string, parts: string) => (
      calls.push([type, req, conn, parts]),
      { frame: encodeU32Frame(T.OK, type) }
    );
    const table = Object.fromEntries([...CLIENT_TYPES].map((t) => [t, handler(t as RequestType)])) as unknown as HandlerTable<
      string,
      string
    >;
    const reply = dispatch(table, { type: T.OBSERVE, vmId: 4, domains: false }, 'conn', 'parts');
    expect(reply.frame).toEqual(encodeU32Frame(T.OK, T.OBSERVE));
    expect(calls).toEqual([[T.OBSERVE, { type: T.OBSERVE, vmId: 4, domains: false }, 'conn', 'parts']]);
    dispatch(table, { type: T.LIST, fromId: 1 }, 'c2', 'p2');
    expect(calls[1]![0]).toBe(T.LIST);
  });
});

describe('HANDLERS', () => {
  it('has a handler for every request type the decoder accepts, and for nothing else', () => {
    expect(
      Object.keys(HANDLERS)
        .map(Number)
        .sort((a, b) => a - b),
    ).toEqual([...CLIENT_TYPES].sort((a, b) => a - b));
    for (const h of Object.values(HANDLERS)) expect(typeof h).toBe('function');
  });
});
