/*
 * cartpole_actor: a simulator in C trained by zmq_rl through remote inference.
 *
 * CartPole (gymnasium's CartPole-v1 dynamics: Euler steps of 0.02 s, reward 1 per
 * step, terminated when |x| > 2.4 or |theta| > 12 degrees, truncated at 500 steps)
 * for NUM_ENVS independent carts, stepped in lockstep. The policy runs in
 * `zmq-rl serve`: this program attaches to it, then sends one `infer` per step (the
 * observations of every cart and the outcome of the previous actions) and applies
 * the `action` reply, until the server answers `shutdown` (the learner's run is
 * over). The messages are specified in docs/inference.md; every message is one
 * ZeroMQ frame holding one msgpack map; arrays are {dtype, shape, data} maps of raw
 * little-endian bytes.
 *
 * Usage: cartpole_actor [ENDPOINT [NUM_ENVS [SEED [TIMEOUT_MS]]]]
 *   ENDPOINT    the server's ROUTER, default tcp://127.0.0.1:5600
 *   NUM_ENVS    carts, default 4 (1..1024)
 *   SEED        seed of the carts' random starts, default 1
 *   TIMEOUT_MS  give up when the server does not answer within this, default 60000
 * Exit codes: 0 the run ended (shutdown), 1 the server refused (error reply) or
 * did not answer, 2 bad arguments. The last line on stdout is a summary:
 *   done steps=N episodes=E mean_return=R last_return=L
 *
 * Build: make (needs libzmq3-dev and libmsgpack-dev on Debian).
 */
#include <math.h>
#include <msgpack.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#define PROTO 2
#define OBS_DIM 4
#define MAX_ENVS 1024
#define MAX_EPISODE_STEPS 500

/* ------------------------------------------------------------------ physics */

typedef struct {
    double x, x_dot, theta, theta_dot;
    int steps;
    double ret; /* return of the episode so far */
} Cart;

static uint64_t rng_state;

static double uniform(double lo, double hi) /* splitmix64 */
{
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return lo + (hi - lo) * ((double)(z >> 11) / 9007199254740992.0);
}

static void cart_reset(Cart *c)
{
    c->x = uniform(-0.05, 0.05);
    c->x_dot = uniform(-0.05, 0.05);
    c->theta = uniform(-0.05, 0.05);
    c->theta_dot = uniform(-0.05, 0.05);
    c->steps = 0;
    c->ret = 0.0;
}

static void cart_observe(const Cart *c, float *out)
{
    out[0] = (float)c->x;
    out[1] = (float)c->x_dot;
    out[2] = (float)c->theta;
    out[3] = (float)c->theta_dot;
}

/* One step with action 0 (push left) or 1 (push right); returns whether terminated. */
static int cart_step(Cart *c, int64_t action)
{
    const double gravity = 9.8, masscart = 1.0, masspole = 0.1, length = 0.5;
    const double total_mass = masscart + masspole, polemass_length = masspole * length;
    const double force = action == 1 ? 10.0 : -10.0, tau = 0.02;
    const double theta_limit = 12.0 * 2.0 * M_PI / 360.0;
    double costheta = cos(c->theta), sintheta = sin(c->theta);
    double temp = (force + polemass_length * c->theta_dot * c->theta_dot * sintheta) / total_mass;
    double thetaacc = (gravity * sintheta - costheta * temp) /
                      (length * (4.0 / 3.0 - masspole * costheta * costheta / total_mass));
    double xacc = temp - polemass_length * thetaacc * costheta / total_mass;
    c->x += tau * c->x_dot;
    c->x_dot += tau * xacc;
    c->theta += tau * c->theta_dot;
    c->theta_dot += tau * thetaacc;
    c->steps += 1;
    c->ret += 1.0;
    return c->x < -2.4 || c->x > 2.4 || c->theta < -theta_limit || c->theta > theta_limit;
}

/* ------------------------------------------------------------------ msgpack helpers */

static void pack_str(msgpack_packer *pk, const char *s)
{
    size_t n = strlen(s);
    msgpack_pack_str(pk, n);
    msgpack_pack_str_body(pk, s, n);
}

/* An array map {dtype, shape, data}: `data` holds the raw little-endian bytes. */
static void pack_array(msgpack_packer *pk, const char *dtype, const int64_t *shape, int ndim,
                       const void *data, size_t nbytes)
{
    msgpack_pack_map(pk, 3);
    pack_str(pk, "dtype");
    pack_str(pk, dtype);
    pack_str(pk, "shape");
    msgpack_pack_array(pk, (size_t)ndim);
    for (int i = 0; i < ndim; i++)
        msgpack_pack_int64(pk, shape[i]);
    pack_str(pk, "data");
    msgpack_pack_bin(pk, nbytes);
    msgpack_pack_bin_body(pk, data, nbytes);
}

/* The envelope every message starts with; `fields` more key/value pairs follow. */
static void pack_header(msgpack_packer *pk, const char *type, size_t fields)
{
    msgpack_pack_map(pk, 2 + fields);
    pack_str(pk, "proto");
    msgpack_pack_int(pk, PROTO);
    pack_str(pk, "type");
    pack_str(pk, type);
}

static const msgpack_object *map_get(const msgpack_object *map, const char *key)
{
    if (map->type != MSGPACK_OBJECT_MAP)
        return NULL;
    size_t n = strlen(key);
    for (uint32_t i = 0; i < map->via.map.size; i++) {
        const msgpack_object *k = &map->via.map.ptr[i].key;
        if (k->type == MSGPACK_OBJECT_STR && k->via.str.size == n &&
            memcmp(k->via.str.ptr, key, n) == 0)
            return &map->via.map.ptr[i].val;
    }
    return NULL;
}

static int str_is(const msgpack_object *o, const char *s)
{
    return o && o->type == MSGPACK_OBJECT_STR && o->via.str.size == strlen(s) &&
           memcmp(o->via.str.ptr, s, o->via.str.size) == 0;
}

static void print_str(FILE *f, const msgpack_object *o)
{
    if (o && o->type == MSGPACK_OBJECT_STR)
        fprintf(f, "%.*s", (int)o->via.str.size, o->via.str.ptr);
    else
        fprintf(f, "?");
}

/* ------------------------------------------------------------------ the exchange */

typedef struct {
    void *socket;
    msgpack_sbuffer buffer;
    msgpack_unpacked reply;
    zmq_msg_t frame;
} Link;

/* Send the packed buffer, wait for the reply and unpack it; 0 on success. */
static int exchange(Link *link, const char *what)
{
    if (zmq_send(link->socket, link->buffer.data, link->buffer.size, 0) < 0) {
        fprintf(stderr, "cartpole_actor: sending %s: %s\n", what, zmq_strerror(zmq_errno()));
        return -1;
    }
    zmq_msg_close(&link->frame);
    zmq_msg_init(&link->frame);
    if (zmq_msg_recv(&link->frame, link->socket, 0) < 0) {
        fprintf(stderr, "cartpole_actor: no answer to %s: %s\n", what, zmq_strerror(zmq_errno()));
        return -1;
    }
    size_t offset = 0;
    msgpack_unpacked_destroy(&link->reply);
    msgpack_unpacked_init(&link->reply);
    if (msgpack_unpack_next(&link->reply, zmq_msg_data(&link->frame), zmq_msg_size(&link->frame),
                            &offset) != MSGPACK_UNPACK_SUCCESS ||
        link->reply.data.type != MSGPACK_OBJECT_MAP) {
        fprintf(stderr, "cartpole_actor: the answer to %s is not a msgpack map\n", what);
        return -1;
    }
    const msgpack_object *type = map_get(&link->reply.data, "type");
    if (str_is(type, "error")) {
        fprintf(stderr, "cartpole_actor: the server refused %s (", what);
        print_str(stderr, map_get(&link->reply.data, "code"));
        fprintf(stderr, "): ");
        print_str(stderr, map_get(&link->reply.data, "reason"));
        fprintf(stderr, "\n");
        return -1;
    }
    return 0;
}

/* Check that the attached reply's spaces are CartPole's: a box of 4, discrete 2. */
static int check_spaces(const msgpack_object *reply)
{
    const msgpack_object *obs = map_get(reply, "observation_space");
    const msgpack_object *act = map_get(reply, "action_space");
    const msgpack_object *shape = obs ? map_get(obs, "shape") : NULL;
    const msgpack_object *n = act ? map_get(act, "n") : NULL;
    if (!obs || !str_is(map_get(obs, "kind"), "box") || !shape ||
        shape->type != MSGPACK_OBJECT_ARRAY || shape->via.array.size != 1 ||
        shape->via.array.ptr[0].via.u64 != OBS_DIM || !act ||
        !str_is(map_get(act, "kind"), "discrete") || !n || n->via.u64 != 2) {
        fprintf(stderr, "cartpole_actor: the learner's spaces are not CartPole's "
                        "(a box of 4 observations, 2 discrete actions)\n");
        return -1;
    }
    return 0;
}

/* Read the `actions` array of an action reply into `out` (num_envs int64); 0 on success. */
static int read_actions(const msgpack_object *reply, int num_envs, int64_t *out)
{
    const msgpack_object *arr = map_get(reply, "actions");
    const msgpack_object *dtype = arr ? map_get(arr, "dtype") : NULL;
    const msgpack_object *data = arr ? map_get(arr, "data") : NULL;
    if (!data || data->type != MSGPACK_OBJECT_BIN)
        return -1;
    const unsigned char *bytes = (const unsigned char *)data->via.bin.ptr;
    if (str_is(dtype, "int64") && data->via.bin.size == (uint32_t)num_envs * 8) {
        memcpy(out, bytes, (size_t)num_envs * 8);
    } else if (str_is(dtype, "int32") && data->via.bin.size == (uint32_t)num_envs * 4) {
        for (int i = 0; i < num_envs; i++) {
            int32_t v;
            memcpy(&v, bytes + 4 * i, 4);
            out[i] = v;
        }
    } else {
        return -1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    const char *endpoint = argc > 1 ? argv[1] : "tcp://127.0.0.1:5600";
    int num_envs = argc > 2 ? atoi(argv[2]) : 4;
    long seed = argc > 3 ? atol(argv[3]) : 1;
    int timeout_ms = argc > 4 ? atoi(argv[4]) : 60000;
    if (num_envs < 1 || num_envs > MAX_ENVS || timeout_ms < 1) {
        fprintf(stderr, "usage: %s [ENDPOINT [NUM_ENVS 1..%d [SEED [TIMEOUT_MS]]]]\n", argv[0],
                MAX_ENVS);
        return 2;
    }
    const uint16_t probe = 1;
    if (*(const unsigned char *)&probe != 1) {
        fprintf(stderr, "cartpole_actor: arrays travel little-endian; this host is not\n");
        return 2;
    }
    rng_state = (uint64_t)seed;

    void *ctx = zmq_ctx_new();
    Link link = {.socket = zmq_socket(ctx, ZMQ_DEALER)};
    int linger = 0, hwm = 100;
    zmq_setsockopt(link.socket, ZMQ_LINGER, &linger, sizeof linger);
    zmq_setsockopt(link.socket, ZMQ_SNDHWM, &hwm, sizeof hwm);
    zmq_setsockopt(link.socket, ZMQ_RCVHWM, &hwm, sizeof hwm);
    zmq_setsockopt(link.socket, ZMQ_RCVTIMEO, &timeout_ms, sizeof timeout_ms);
    if (zmq_connect(link.socket, endpoint) != 0) {
        fprintf(stderr, "cartpole_actor: cannot connect to %s: %s\n", endpoint,
                zmq_strerror(zmq_errno()));
        return 2;
    }
    msgpack_sbuffer_init(&link.buffer);
    msgpack_unpacked_init(&link.reply);
    zmq_msg_init(&link.frame);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &link.buffer, msgpack_sbuffer_write);

    int code = 1;
    Cart carts[MAX_ENVS];
    float obs[MAX_ENVS * OBS_DIM], final_obs[MAX_ENVS * OBS_DIM], reward[MAX_ENVS];
    uint8_t terminated[MAX_ENVS], truncated[MAX_ENVS];
    int32_t final_index[MAX_ENVS];
    int64_t actions[MAX_ENVS];
    long steps = 0, episodes = 0;
    double return_sum = 0.0, last_return = 0.0;
    int num_final = 0;
    /* attach: our slots; empty space maps take the learner's spaces (checked below). */
    pack_header(&pk, "attach", 4);
    pack_str(&pk, "num_envs");
    msgpack_pack_int(&pk, num_envs);
    pack_str(&pk, "env_id");
    pack_str(&pk, "CartPole-v1");
    pack_str(&pk, "observation_space");
    msgpack_pack_map(&pk, 0);
    pack_str(&pk, "action_space");
    msgpack_pack_map(&pk, 0);
    if (exchange(&link, "attach") != 0 || check_spaces(&link.reply.data) != 0)
        goto out;

    for (int i = 0; i < num_envs; i++) {
        cart_reset(&carts[i]);
        cart_observe(&carts[i], obs + OBS_DIM * i);
    }
    for (;;) {
        /* infer: this step's observations, and (after the first) the last step's outcome */
        int64_t shape_obs[2] = {num_envs, OBS_DIM}, shape_b[1] = {num_envs};
        int64_t shape_k[1] = {num_final}, shape_final[2] = {num_final, OBS_DIM};
        msgpack_sbuffer_clear(&link.buffer);
        pack_header(&pk, "infer", steps ? 6 : 1);
        pack_str(&pk, "obs");
        pack_array(&pk, "float32", shape_obs, 2, obs, sizeof(float) * OBS_DIM * num_envs);
        if (steps) {
            pack_str(&pk, "reward");
            pack_array(&pk, "float32", shape_b, 1, reward, sizeof(float) * num_envs);
            pack_str(&pk, "terminated");
            pack_array(&pk, "bool", shape_b, 1, terminated, (size_t)num_envs);
            pack_str(&pk, "truncated");
            pack_array(&pk, "bool", shape_b, 1, truncated, (size_t)num_envs);
            pack_str(&pk, "final_obs_index");
            pack_array(&pk, "int32", shape_k, 1, final_index, sizeof(int32_t) * num_final);
            pack_str(&pk, "final_obs");
            pack_array(&pk, "float32", shape_final, 2, final_obs,
                       sizeof(float) * OBS_DIM * num_final);
        }
        if (exchange(&link, "infer") != 0)
            goto out;
        const msgpack_object *type = map_get(&link.reply.data, "type");
        if (str_is(type, "shutdown")) {
            printf("run over: ");
            print_str(stdout, map_get(&link.reply.data, "reason"));
            printf("\n");
            code = 0;
            break;
        }
        if (!str_is(type, "action") || read_actions(&link.reply.data, num_envs, actions) != 0) {
            fprintf(stderr, "cartpole_actor: expected an action reply with %d int actions\n",
                    num_envs);
            goto out;
        }
        /* step every cart; a finished episode restarts (its next obs is the reset one) */
        num_final = 0;
        for (int i = 0; i < num_envs; i++) {
            Cart *c = &carts[i];
            if (actions[i] != 0 && actions[i] != 1) {
                fprintf(stderr, "cartpole_actor: action %lld out of range\n",
                        (long long)actions[i]);
                goto out;
            }
            terminated[i] = (uint8_t)cart_step(c, actions[i]);
            truncated[i] = (uint8_t)(!terminated[i] && c->steps >= MAX_EPISODE_STEPS);
            reward[i] = 1.0f;
            if (terminated[i] || truncated[i]) {
                if (truncated[i]) { /* the true last observation, for bootstrapping */
                    cart_observe(c, final_obs + OBS_DIM * num_final);
                    final_index[num_final++] = i;
                }
                episodes += 1;
                return_sum += c->ret;
                last_return = c->ret;
                cart_reset(c);
            }
            cart_observe(c, obs + OBS_DIM * i);
        }
        steps += 1;
    }
out:
    printf("done steps=%ld episodes=%ld mean_return=%.2f last_return=%.1f\n", steps * num_envs,
           episodes, episodes ? return_sum / (double)episodes : 0.0, last_return);
    fflush(stdout);
    zmq_msg_close(&link.frame);
    msgpack_unpacked_destroy(&link.reply);
    msgpack_sbuffer_destroy(&link.buffer);
    zmq_close(link.socket);
    zmq_ctx_term(ctx);
    return code;
}
