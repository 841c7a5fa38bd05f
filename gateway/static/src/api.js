// The gateway's HTTP API as the page uses it: GET with the token (when this gateway wants
// one), answers as JSON or Blobs, errors as the API's `{"error": {code, message}}`.

export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

export class Api {
  /** @param {() => string} token  the token to present (empty: none) */
  constructor(token) {
    this.token = token;
  }

  async request(path, method = "GET") {
    const token = this.token();
    let response;
    try {
      response = await fetch(path, { method, headers: token ? { Authorization: `Bearer ${token}` } : {} });
    } catch (err) {
      throw new ApiError(0, "unreachable", `The gateway did not answer (${err.message}).`);
    }
    if (!response.ok) {
      let code = "http_error";
      let message = `HTTP ${response.status}`;
      try {
        const body = await response.json();
        code = body?.error?.code || code;
        message = body?.error?.message || message;
      } catch {
        // not the API's error shape: keep the status
      }
      throw new ApiError(response.status, code, message);
    }
    return response;
  }

  async json(path) {
    return (await this.request(path)).json();
  }

  async blob(path) {
    return (await this.request(path)).blob();
  }

  /** `GET /v1/runs`: the caller's runs, newest first: `{runs: [...], next}`. */
  listRuns({ cursor = null, limit = 30 } = {}) {
    const query = new URLSearchParams({ limit: String(limit) });
    if (cursor) query.set("cursor", cursor);
    return this.json(`/v1/runs?${query}`);
  }

  getRun(id) {
    return this.json(`/v1/runs/${encodeURIComponent(id)}`);
  }

  /** The run as an nbformat notebook (parsed). */
  getNotebook(id) {
    return this.json(`/v1/runs/${encodeURIComponent(id)}/notebook`);
  }

  /** `DELETE /v1/snapshots/{id}`; one that is gone already is no failure. */
  async deleteSnapshot(id) {
    try {
      await this.request(`/v1/snapshots/${encodeURIComponent(id)}`, "DELETE");
    } catch (err) {
      if (![404, 410].includes(err.status)) throw err;
    }
  }
}
